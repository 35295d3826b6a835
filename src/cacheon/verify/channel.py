"""The byte format between parent and candidate child: msgpack with tensors as raw bytes.

Not pickle, in either direction: torch's multiprocessing pickler shares tensor storage (the child
could then write into the parent's trusted inputs), and unpickling anything from the candidate's
process would let it run code in the parent. Here a tensor is ``{dtype, shape, data}`` and the
parent rebuilds it by value after checking dtype and size.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import torch

from cacheon.contract.spec import DTYPES

_TAG = "__tensor__"
_NAMES = {v: k for k, v in DTYPES.items()}


class ChannelError(ValueError):
    """A message that does not follow the format (a candidate forging or corrupting the channel)."""


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        if t.dtype not in _NAMES:
            raise TypeError(f"tensor dtype {t.dtype} cannot cross the channel")
        return {_TAG: _NAMES[t.dtype], "shape": list(t.shape), "data": t.view(torch.uint8).numpy().tobytes()}
    if isinstance(obj, torch.dtype):
        return _NAMES[obj]
    raise TypeError(f"cannot encode {type(obj).__name__}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)


def encode(message: Any) -> bytes:
    return _encoder.encode(message)


def _tensor(obj: dict) -> torch.Tensor:
    name, shape, data = obj.get(_TAG), obj.get("shape"), obj.get("data")
    if name not in DTYPES or not isinstance(shape, list) or not isinstance(data, bytes):
        raise ChannelError("malformed tensor")
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ChannelError("malformed tensor shape")
    dtype = DTYPES[name]
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(data) != math.prod(shape) * itemsize:
        raise ChannelError(f"tensor data is {len(data)} bytes, shape {shape} needs {math.prod(shape) * itemsize}")
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _revive(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _TAG in obj:
            return _tensor(obj)
        return {k: _revive(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_revive(v) for v in obj]
    return obj


def decode(data: bytes) -> Any:
    try:
        return _revive(msgspec.msgpack.decode(data))
    except msgspec.DecodeError as exc:
        raise ChannelError(f"undecodable message: {exc}") from None


def dtype_of(name: str) -> torch.dtype:
    return DTYPES[name]
