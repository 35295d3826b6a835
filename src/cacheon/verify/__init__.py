"""Verification: run a candidate in an isolated child, judge it in the parent."""
