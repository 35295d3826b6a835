"""The parent↔child protocol: one msgspec tagged struct per message, one union per direction.

The types are the contract: the parent decodes what the child sends into ``FromChild`` and
nothing else (a forged or truncated message is a decode error, never a half-trusted dict), and a
tensor is plain data (dtype name, shape, raw bytes) that the receiver rebuilds by value. Every
struct refuses fields it does not name, and every string, list and map has a bound: a message
past one is a decode error, so what the child sends is bounded before the parent looks at it.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

#: characters in one line of text from the child (a reason, a note, a description)
TEXT_CHARS = 4096
#: characters in a traceback from the child (shown with --debug only)
DETAIL_CHARS = 32768
#: notes in one list (layout violations, harness problems), entries in one map
MAX_NOTES = 16
MAX_TENSORS = 64
MAX_DIMS = 8

Text = Annotated[str, msgspec.Meta(max_length=TEXT_CHARS)]
Detail = Annotated[str, msgspec.Meta(max_length=DETAIL_CHARS)]
Notes = Annotated[list[Text], msgspec.Meta(max_length=MAX_NOTES)]
Name = Annotated[str, msgspec.Meta(max_length=64)]
Shape = Annotated[list[Annotated[int, msgspec.Meta(ge=0)]], msgspec.Meta(max_length=MAX_DIMS)]


class _Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Every message: immutable, and a field it does not declare is refused, never ignored. (Each
    subclass repeats ``frozen=True`` for type checkers; the config is inherited either way.)"""


class WireTensor(_Message, array_like=True, frozen=True):
    dtype: Name
    shape: Shape
    data: bytes


Tensors = Annotated[dict[Name, WireTensor], msgspec.Meta(max_length=MAX_TENSORS)]


class OutputSpec(_Message, array_like=True, frozen=True):
    shape: Shape
    dtype: Name


class Poison(_Message, array_like=True, frozen=True):
    """What the child writes into every output before the candidate runs (drawn per call);
    ``pool``: earlier reference outputs, the stale data of the kinds that use it."""

    kind: str
    seed: int
    pool: WireTensor | None = None


Scalar = bool | int | float


# parent -> child


class Call(_Message, tag="call", frozen=True):
    """Run the entry on buffer set ``buffers``: fresh buffers (``refill`` false) or new values
    copied into the existing ones (only the graph-dynamic inputs travel then)."""

    seq: int
    buffers: int
    refill: bool
    inputs: Tensors
    outputs: dict[Name, OutputSpec]
    scalars: dict[str, Scalar]
    args: list[str]
    prepare: list[str]  # inputs handed to the bundle's prepare (fresh buffers only)
    poison: Poison
    frames: int = 0  # extra stack frames the entry is called under (the call depth, varied per call)


class Capture(_Message, tag="capture", frozen=True):
    """Set up ``call``'s buffers and capture one call of the entry with the graph backend."""

    call: Call
    backend: str


class Replay(_Message, tag="replay", frozen=True):
    """Copy fresh dynamic inputs into the captured buffers, poison the outputs, replay."""

    seq: int
    buffers: int
    inputs: Tensors
    poison: Poison


class Stop(_Message, tag="stop", frozen=True):
    pass


ToChild = Call | Capture | Replay | Stop


# child -> parent


class Booted(_Message, tag="booted", frozen=True):
    """Sent once the confinement is applied, before any candidate code is imported."""

    rank: int
    applied: Annotated[dict[Name, Text], msgspec.Meta(max_length=MAX_TENSORS)]


class Ready(_Message, tag="ready", frozen=True):
    rank: int


class ImportFailed(_Message, tag="import_failed", frozen=True):
    reason: Text  # one line
    detail: Detail  # the traceback, shown with --debug only


class Result(_Message, tag="result", frozen=True):
    seq: int
    outputs: Tensors
    inputs_after: Tensors
    violations: Notes  # layout checks made in the child: they can only make a verdict worse
    harness: Notes  # problems of the harness itself (a refill that changed nothing)
    returned: Text = ""  # what the entry returned, described ("" for None): a hint for its author, never judged


class Raised(_Message, tag="raised", frozen=True):
    seq: int
    reason: Text
    detail: Detail


class Captured(_Message, tag="captured", frozen=True):
    seq: int


class BackendFailed(_Message, tag="backend_failed", frozen=True):
    """The graph machinery itself failed: an infrastructure error, not the candidate's."""

    seq: int
    detail: Detail


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
