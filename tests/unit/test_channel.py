"""The parent↔child channel: typed messages, tensors by value, forgeries refused."""

import msgspec
import pytest
import torch

from cacheon.verify import channel
from cacheon.verify.messages import Call, OutputSpec, Poison, Raised, Result, WireTensor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.bool])
def test_tensors_round_trip_by_value(dtype):
    t = (torch.randn(3, 5) * 10).to(dtype)
    sent = Result(7, {"out": channel.to_wire(t)}, {}, ["v"], [])
    back = channel.decode_from_child(channel.encode(sent))
    assert isinstance(back, Result) and back.seq == 7 and back.violations == ["v"]
    got = channel.from_wire(back.outputs["out"])
    assert got.dtype == dtype and torch.equal(got, t)
    original = t.clone()
    got.view(torch.uint8).bitwise_not_()  # scribbling on the copy leaves the sender's tensor alone
    assert torch.equal(t, original)


def test_each_direction_decodes_only_its_own_messages():
    call = Call(1, 0, False, {}, {"out": OutputSpec([2], "float32")}, {"eps": 1e-6, "causal": True}, ["x"], [],
                Poison("nan", 3))
    assert channel.decode_to_child(channel.encode(call)) == call
    with pytest.raises(channel.ChannelError):
        channel.decode_from_child(channel.encode(call))  # a child cannot answer with a parent's message
    assert isinstance(channel.decode_from_child(channel.encode(Raised(1, "ValueError: x", "tb"))), Raised)


def test_forged_messages_are_rejected():
    forged = channel.encode(Result(1, {"out": WireTensor("float32", [1000], b"\x00" * 4)}, {}, [], []))
    reply = channel.decode_from_child(forged)
    assert isinstance(reply, Result)
    with pytest.raises(channel.ChannelError, match="needs 4000"):
        channel.from_wire(reply.outputs["out"])
    with pytest.raises(channel.ChannelError, match="not one the channel carries"):
        channel.from_wire(WireTensor("object", [1], b"x"))
    with pytest.raises(channel.ChannelError, match="malformed tensor shape"):
        channel.from_wire(WireTensor("float32", [-1], b""))
    for data in (b"\xc1garbage", msgspec.msgpack.encode({"type": "result", "seq": "one"}),
                 msgspec.msgpack.encode(["result", 1, {}, {}, [], []])):
        with pytest.raises(channel.ChannelError):
            channel.decode_from_child(data)
