"""The bytes between parent and candidate child: msgpack of the typed messages, tensors by value.

Not pickle, in either direction: torch's multiprocessing pickler shares tensor storage (the child
could then write into the parent's trusted inputs), and unpickling anything from the candidate's
process would let it run code in the parent. A tensor crosses as ``WireTensor`` and the receiver
rebuilds it by value after checking its dtype and size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec
import torch

from cacheon.contract.spec import DTYPES
from cacheon.verify.messages import FromChild, ToChild, WireTensor

_NAMES = {v: k for k, v in DTYPES.items()}
_encoder = msgspec.msgpack.Encoder()
_from_child = msgspec.msgpack.Decoder(FromChild)
_to_child = msgspec.msgpack.Decoder(ToChild)


class ChannelError(ValueError):
    """A message that does not follow the protocol (a candidate forging or corrupting the channel)."""


def to_wire(tensor: torch.Tensor) -> WireTensor:
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype not in _NAMES:
        raise TypeError(f"tensor dtype {t.dtype} cannot cross the channel")
    return WireTensor(_NAMES[t.dtype], list(t.shape), t.view(torch.uint8).numpy().tobytes())


def from_wire(wire: WireTensor) -> torch.Tensor:
    dtype = DTYPES.get(wire.dtype)
    if dtype is None:
        raise ChannelError(f"tensor dtype {wire.dtype!r} is not one the channel carries")
    if not all(n >= 0 for n in wire.shape):
        raise ChannelError(f"malformed tensor shape {wire.shape}")
    need = math.prod(wire.shape) * torch.empty((), dtype=dtype).element_size()
    if len(wire.data) != need:
        raise ChannelError(f"tensor data is {len(wire.data)} bytes, shape {wire.shape} needs {need}")
    if not wire.data:
        return torch.empty(wire.shape, dtype=dtype)
    return torch.frombuffer(bytearray(wire.data), dtype=torch.uint8).view(dtype).reshape(wire.shape)


def tensors_to_wire(tensors: Mapping[str, torch.Tensor]) -> dict[str, WireTensor]:
    return {name: to_wire(t) for name, t in tensors.items()}


def tensors_from_wire(wires: Mapping[str, WireTensor]) -> dict[str, torch.Tensor]:
    return {name: from_wire(w) for name, w in wires.items()}


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
