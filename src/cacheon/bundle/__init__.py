"""Bundles: a manifest plus kernel sources that implement registered slots."""
