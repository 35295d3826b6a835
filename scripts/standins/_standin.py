"""Cacheon import stand-in runtime: names resolve so that imports succeed; calling one raises.

This file is copied into every stand-in wheel scripts/standins/build_wheel.py builds (as
``<package>/_standin.py``); the version label ``+cacheon.standin`` marks the distribution, so
runtime identity capture lists it and no evidence record can pass it off as the real package.
"""

VERSION = "0.0.0+cacheon.standin"


class StandInUsed(RuntimeError):
    """Raised when code calls into a stand-in: this environment lacks the real package."""


class StandIn:
    """A placeholder for a name of the real package; calling it raises StandInUsed."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return StandIn(self._name + "." + attr)

    def __call__(self, *args, **kwargs):
        raise StandInUsed(self._name + ": a Cacheon import stand-in (" + VERSION + ") is installed here")

    def __repr__(self):
        return "<cacheon stand-in " + self._name + ">"


def module_getattr(module):
    """A module ``__getattr__`` that answers every public name with a StandIn."""

    def __getattr__(attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return StandIn(module + "." + attr)

    return __getattr__
