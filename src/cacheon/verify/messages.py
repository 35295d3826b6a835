"""The parent↔child protocol: one msgspec tagged struct per message, one union per direction.

The types are the contract: the parent decodes what the child sends into ``FromChild`` and
nothing else (a forged or truncated message is a decode error, never a half-trusted dict), and a
tensor is plain data (dtype name, shape, raw bytes) that the receiver rebuilds by value.
"""

from __future__ import annotations

import msgspec


class WireTensor(msgspec.Struct, array_like=True, frozen=True):
    dtype: str
    shape: list[int]
    data: bytes


class OutputSpec(msgspec.Struct, array_like=True, frozen=True):
    shape: list[int]
    dtype: str


class Poison(msgspec.Struct, array_like=True, frozen=True):
    """What the child writes into every output before the candidate runs (drawn per call);
    ``pool``: earlier reference outputs, the stale data of the kinds that use it."""

    kind: str
    seed: int
    pool: WireTensor | None = None


Scalar = bool | int | float


# parent -> child


class Call(msgspec.Struct, tag="call", frozen=True):
    """Run the entry on buffer set ``buffers``: fresh buffers (``refill`` false) or new values
    copied into the existing ones (only the graph-dynamic inputs travel then)."""

    seq: int
    buffers: int
    refill: bool
    inputs: dict[str, WireTensor]
    outputs: dict[str, OutputSpec]
    scalars: dict[str, Scalar]
    args: list[str]
    prepare: list[str]  # inputs handed to the bundle's prepare (fresh buffers only)
    poison: Poison
    frames: int = 0  # extra stack frames the entry is called under (the call depth, varied per call)


class Capture(msgspec.Struct, tag="capture", frozen=True):
    """Set up ``call``'s buffers and capture one call of the entry with the graph backend."""

    call: Call
    backend: str


class Replay(msgspec.Struct, tag="replay", frozen=True):
    """Copy fresh dynamic inputs into the captured buffers, poison the outputs, replay."""

    seq: int
    buffers: int
    inputs: dict[str, WireTensor]
    poison: Poison


class Stop(msgspec.Struct, tag="stop", frozen=True):
    pass


ToChild = Call | Capture | Replay | Stop


# child -> parent


class Booted(msgspec.Struct, tag="booted", frozen=True):
    """Sent once the confinement is applied, before any candidate code is imported."""

    rank: int
    applied: dict[str, str]


class Ready(msgspec.Struct, tag="ready", frozen=True):
    rank: int


class ImportFailed(msgspec.Struct, tag="import_failed", frozen=True):
    reason: str  # one line
    detail: str  # the traceback, shown with --debug only


class Result(msgspec.Struct, tag="result", frozen=True):
    seq: int
    outputs: dict[str, WireTensor]
    inputs_after: dict[str, WireTensor]
    violations: list[str]  # layout checks made in the child: they can only make a verdict worse
    harness: list[str]  # problems of the harness itself (a refill that changed nothing)
    returned: str = ""  # what the entry returned, described ("" for None): a hint for its author, never judged


class Raised(msgspec.Struct, tag="raised", frozen=True):
    seq: int
    reason: str
    detail: str


class Captured(msgspec.Struct, tag="captured", frozen=True):
    seq: int


class BackendFailed(msgspec.Struct, tag="backend_failed", frozen=True):
    """The graph machinery itself failed: an infrastructure error, not the candidate's."""

    seq: int
    detail: str


FromChild = Booted | Ready | ImportFailed | Result | Raised | Captured | BackendFailed
Reply = Result | Raised | Captured | BackendFailed


# how the child starts (its one argument, JSON): what to import, where, under which limits


class BootLimits(msgspec.Struct, frozen=True):
    cpu_seconds: int
    address_space_bytes: int | None
    file_bytes: int
    open_files: int
    processes: int | None  # None: not set (unconfined, where it would count the user's every process)


class Boot(msgspec.Struct, frozen=True):
    rank: int  # -1: the launcher that starts one process per rank inside the same sandbox
    world: int
    fds: list[int]  # each rank's channel, as numbered in the child
    bundle: str  # the private copy of the bundle
    slot: str
    source: str
    entry: str
    prepare: str | None
    device: str
    limits: BootLimits
    drop_uid: int | None  # switch to this uid and gid first (bubblewrap started as root)
    workdir: str
    rendezvous: str  # torch.distributed init method for collectives
    confinement: str
