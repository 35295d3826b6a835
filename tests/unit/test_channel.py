import msgspec
import pytest
import torch

from cacheon.verify import channel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.bool])
def test_tensors_round_trip_by_value(dtype):
    t = (torch.randn(3, 5) * 10).to(dtype)
    back = channel.decode(channel.encode(["result", {"t": t, "shape": (3, 5), "dt": torch.bfloat16}]))
    kind, payload = back
    assert kind == "result" and payload["dt"] == "bfloat16" and payload["shape"] == [3, 5]
    assert payload["t"].dtype == dtype and torch.equal(payload["t"], t)
    original = t.clone()
    payload["t"].view(torch.uint8).bitwise_not_()  # scribbling on the copy leaves the sender's tensor alone
    assert torch.equal(t, original)


def test_forged_tensors_are_rejected():
    forged = msgspec.msgpack.encode({"__tensor__": "float32", "shape": [1000], "data": b"\x00" * 4})
    with pytest.raises(channel.ChannelError, match="needs 4000"):
        channel.decode(forged)
    with pytest.raises(channel.ChannelError):
        channel.decode(msgspec.msgpack.encode({"__tensor__": "object", "shape": [1], "data": b"x"}))
    with pytest.raises(channel.ChannelError):
        channel.decode(b"\xc1garbage")
