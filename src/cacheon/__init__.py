"""Cacheon: a toolkit for people who build on an exact SGLang runtime."""

__version__ = "0.1.0"
