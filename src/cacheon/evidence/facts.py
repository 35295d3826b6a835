"""The shape of a stored identity's facts: what every reader of the ledger may rely on.

The facts are hashed as they were captured (:mod:`cacheon.runtime.identity`), so the ledger keeps
them as a dict; but a reader (``evidence show``, ``state``, ``pin status``, the gates, ``kv
contracts``) reads ``packages``, ``gpu`` and ``standins`` in them. The chain walk decodes every
identity's facts into :class:`Facts` before any reader sees them: facts of another shape (a
re-chained forgery, an identity written outside cacheon) break the chain instead of crashing a
reader. Fields a capture has always written are optional here, and unknown ones are kept (a newer
capture may add facts), but whatever is present must have its captured type.
"""

from __future__ import annotations

import msgspec


class Device(msgspec.Struct, frozen=True):
    name: str
    capability: str


class Gpu(msgspec.Struct, frozen=True):
    count: int = 0
    devices: list[Device] = []


class Standin(msgspec.Struct, frozen=True):
    name: str
    version: str = ""


class Facts(msgspec.Struct, frozen=True):
    schema: int = 1
    python: str = ""
    python_implementation: str = ""
    platform: str = ""
    packages: dict[str, str | None] = {}
    sglang_revision: str | None = None
    torch_cuda: str | None = None
    gpu: Gpu = Gpu()
    image_digest: str | None = None
    standins: list[Standin] = []
