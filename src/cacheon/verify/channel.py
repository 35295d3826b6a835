"""The bytes between parent and candidate child: frames of msgpack of the typed messages, tensors by value.

Not pickle, in either direction: torch's multiprocessing pickler shares tensor storage (the child
could then write into the parent's trusted inputs), and unpickling anything from the candidate's
process would let it run code in the parent. A tensor crosses as ``WireTensor`` and the receiver
rebuilds it by value, only after its name, dtype, shape and size match what the parent allocated.

A frame is a 4-byte big-endian length, then that many bytes. The parent reads every frame under
one deadline for the header and the body together (a child that stops mid-frame is a timeout,
never a hang), and refuses a length past the reply's budget before it reads the body.
"""

from __future__ import annotations

import math
import socket
import struct
import time
from collections.abc import Mapping

import msgspec
import torch

from cacheon.contract.spec import DTYPE_NAMES, torch_dtype
from cacheon.verify.messages import (
    DETAIL_CHARS,
    MAX_NOTES,
    MAX_TENSORS,
    TEXT_CHARS,
    Call,
    FromChild,
    ToChild,
    WireTensor,
)

DTYPES = {name: torch_dtype(name) for name in DTYPE_NAMES}
_NAMES = {v: k for k, v in DTYPES.items()}
_encoder = msgspec.msgpack.Encoder()
_from_child = msgspec.msgpack.Decoder(FromChild)
_to_child = msgspec.msgpack.Decoder(ToChild)


HEADER = struct.Struct(">I")
#: what a reply may take beyond its tensors' bytes: every text field at its bound (4 bytes a
#: character), each tensor's name, dtype and shape, and msgpack's framing of it all
TEXT_BUDGET = 4 * (DETAIL_CHARS + (2 * MAX_NOTES + 2) * TEXT_CHARS) + MAX_TENSORS * 1024
SMALL_FRAME = 1 << 16
#: a frame the parent sends, or one a child reads: the protocol's own ceiling
MAX_FRAME = (1 << 32) - 1
Layout = Mapping[str, tuple[tuple[int, ...], torch.dtype]]


class ChannelError(ValueError):
    """A message that does not follow the protocol (a candidate forging or corrupting the channel)."""


class ChannelTimeout(ChannelError):
    """The deadline passed before a whole frame arrived (or went out); ``partial``: its bytes that did."""

    def __init__(self, partial: int) -> None:
        super().__init__(f"the deadline passed mid-frame, after {partial} bytes" if partial else
                         "the deadline passed")
        self.partial = partial


class Endpoint:
    """One end of a parent↔child socket, framed. Every read and write takes a deadline
    (``time.monotonic()`` seconds; None blocks: the child, which trusts its parent)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def from_fd(cls, fd: int) -> Endpoint:
        return cls(socket.socket(fileno=fd))

    def send(self, body: bytes, deadline: float | None = None) -> None:
        if len(body) > MAX_FRAME:
            raise ValueError(f"a {len(body)}-byte message does not fit a frame")
        header = HEADER.pack(len(body))
        # a small frame goes out in one write, so that processes sharing the socket (a candidate
        # that forked) cannot interleave their frames; a large one is not copied to join it
        parts = (header + body,) if len(body) < SMALL_FRAME else (header, body)
        for part in parts:
            self._sock.settimeout(_left(deadline, 0))
            try:
                self._sock.sendall(part)
            except TimeoutError:
                raise ChannelTimeout(0) from None

    def receive(self, limit: int = MAX_FRAME, deadline: float | None = None) -> bytes:
        """One frame's body. EOFError when the peer closed between frames; ChannelError when it
        closed mid-frame or announced more than ``limit`` bytes (refused before the body is read)."""
        (length,) = HEADER.unpack(self._read(HEADER.size, deadline, 0))
        if length > limit:
            raise ChannelError(f"a frame of {length} bytes, more than the {limit} this reply may take")
        return self._read(length, deadline, HEADER.size)

    def _read(self, size: int, deadline: float | None, before: int) -> bytes:
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            self._sock.settimeout(_left(deadline, before + got))
            try:
                n = self._sock.recv_into(view[got:])
            except TimeoutError:
                raise ChannelTimeout(before + got) from None
            if n == 0:
                if before + got == 0:
                    raise EOFError("the channel closed")
                raise ChannelError(f"the channel closed mid-frame, after {before + got} bytes")
            got += n
        return bytes(buf)

    def close(self) -> None:
        self._sock.close()


def _left(deadline: float | None, partial: int) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise ChannelTimeout(partial)
    return left


def to_wire(tensor: torch.Tensor) -> WireTensor:
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype not in _NAMES:
        raise TypeError(f"tensor dtype {t.dtype} cannot cross the channel")
    return WireTensor(_NAMES[t.dtype], list(t.shape), t.view(torch.uint8).numpy().tobytes())


def from_wire(wire: WireTensor, expected: tuple[tuple[int, ...], torch.dtype] | None = None) -> torch.Tensor:
    """The tensor by value. With ``expected`` (what the receiver allocated), a dtype or shape
    other than that is refused before any torch call sees the shape."""
    dtype = DTYPES.get(wire.dtype)
    if dtype is None:
        raise ChannelError(f"tensor dtype {wire.dtype[:32]!r} is not one the channel carries")
    if not all(n >= 0 for n in wire.shape):
        raise ChannelError(f"malformed tensor shape {wire.shape}")
    if expected is not None and (tuple(wire.shape), dtype) != expected:
        shape, want = expected
        raise ChannelError(f"{wire.dtype} {list(wire.shape)} where {dtype_name(want)} {list(shape)} was allocated")
    need = math.prod(wire.shape) * _itemsize(dtype)
    if len(wire.data) != need:
        raise ChannelError(f"tensor data is {len(wire.data)} bytes, shape {wire.shape} needs {need}")
    if not wire.data:
        return torch.empty(wire.shape, dtype=dtype)
    return torch.frombuffer(bytearray(wire.data), dtype=torch.uint8).view(dtype).reshape(wire.shape)


def tensors_to_wire(tensors: Mapping[str, torch.Tensor]) -> dict[str, WireTensor]:
    return {name: to_wire(t) for name, t in tensors.items()}


def tensors_from_wire(wires: Mapping[str, WireTensor], layout: Layout | None = None) -> dict[str, torch.Tensor]:
    """Every tensor by value; with ``layout``, exactly its names, each with its dtype and shape."""
    if layout is not None and set(wires) != set(layout):
        extra, missing = sorted(set(wires) - set(layout)), sorted(set(layout) - set(wires))
        raise ChannelError(f"names {extra[:4]} that were not allocated" if extra else f"lacks {missing}")
    tensors = {}
    for name, wire in wires.items():
        try:
            tensors[name] = from_wire(wire, None if layout is None else layout[name])
        except ChannelError as exc:
            raise ChannelError(f"{name}: {exc}") from None
    return tensors


def layout_of(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}


def buffer_bytes(call: Call) -> int:
    """The bytes of the buffer set ``call`` fills: its inputs as sent, its outputs as declared."""
    inputs = sum(len(w.data) for w in call.inputs.values())
    return inputs + sum(math.prod(s.shape) * _itemsize(dtype_of(s.dtype)) for s in call.outputs.values())


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def encode(message: ToChild | FromChild) -> bytes:
    return _encoder.encode(message)


def decode_from_child(data: bytes) -> FromChild:
    try:
        return _from_child.decode(data)
    except msgspec.DecodeError as exc:
        raise ChannelError(f"undecodable message: {exc}") from None


def decode_to_child(data: bytes) -> ToChild:
    try:
        return _to_child.decode(data)
    except msgspec.DecodeError as exc:
        raise ChannelError(f"undecodable message: {exc}") from None


def dtype_of(name: str) -> torch.dtype:
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return _NAMES[dtype]
