"""Serving a candidate's kernel: the pinned SGLang server with a bundle armed inside the verify sandbox.

Above ``verify`` (whose sandbox it reuses) and ``runtime`` (whose activation arms the bundle inside the server).
"""
