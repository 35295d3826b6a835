"""The kernel language: the default-deny subset of Python a bundle's sources are written in."""
