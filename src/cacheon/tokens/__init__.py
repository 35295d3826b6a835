"""Tokenization as a worker does it: profiles, exact window and stem caches, hash chains of cached pieces."""
