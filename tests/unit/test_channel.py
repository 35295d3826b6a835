"""The parent↔child channel: typed messages, tensors by value, forgeries refused, frames under deadlines."""

import contextlib
import socket
import threading
import time

import msgspec
import pytest
import torch

from cacheon.printable import _plain, escape_controls
from cacheon.verify import channel
from cacheon.verify.messages import (
    DETAIL_CHARS,
    MAX_DIMS,
    MAX_NOTES,
    MAX_TENSORS,
    TEXT_CHARS,
    Booted,
    Call,
    OutputSpec,
    Poison,
    Raised,
    Result,
    WireTensor,
)
from cacheon.verify.untrusted import bounded, describe, escaped


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


# framing: every read and write under one deadline, a frame's length checked before its body


@pytest.fixture
def pair():
    parent, child = socket.socketpair()
    yield channel.Endpoint(parent), child
    parent.close()
    child.close()


def soon(seconds: float = 0.3) -> float:
    return time.monotonic() + seconds


def test_a_frame_round_trips(pair):
    end, child = pair
    channel.Endpoint(child).send(b"hello")
    assert end.receive(16, soon()) == b"hello"


def test_a_child_that_stops_mid_frame_is_a_timeout_never_a_hang(pair):
    end, child = pair
    child.sendall(channel.HEADER.pack(1000) + b"x" * 10)
    started = time.monotonic()
    with pytest.raises(channel.ChannelTimeout) as late:
        end.receive(4096, soon())
    assert late.value.partial == channel.HEADER.size + 10 and time.monotonic() - started < 5


def test_one_deadline_covers_the_whole_frame_not_each_read(pair):
    """A drip of one byte per read, each within any per-read timeout, still ends at the frame's deadline."""
    end, child = pair

    def drip():
        with contextlib.suppress(OSError):
            for byte in channel.HEADER.pack(64) + b"y" * 64:
                child.send(bytes([byte]))
                time.sleep(0.05)

    threading.Thread(target=drip, daemon=True).start()
    with pytest.raises(channel.ChannelTimeout):
        end.receive(4096, soon(0.5))


def test_a_frame_longer_than_the_budget_is_refused_before_its_body(pair):
    end, child = pair
    child.sendall(channel.HEADER.pack(1 << 31))  # no body follows: refusing must not wait for one
    with pytest.raises(channel.ChannelError, match="more than the 4096 this reply may take"):
        end.receive(4096, soon(30))


def test_a_close_between_frames_is_eof_and_mid_frame_a_protocol_error(pair):
    end, child = pair
    child.sendall(channel.HEADER.pack(8) + b"abc")
    child.close()
    with pytest.raises(channel.ChannelError, match="closed mid-frame, after 7 bytes"):
        end.receive(4096, soon())
    with pytest.raises(EOFError):
        end.receive(4096, soon())


def test_a_peer_that_stops_reading_times_the_send_out(pair):
    end, _ = pair
    with pytest.raises(channel.ChannelTimeout):
        end.send(b"z" * (64 << 20), soon())  # far more than a socket buffer, and nobody reads


# messages: unknown fields refused, every text and list bounded, shapes checked against the layout


def test_unknown_fields_and_oversized_texts_are_refused_at_decode():
    raised = msgspec.msgpack.encode({"type": "raised", "seq": 1, "reason": "r", "detail": "d", "junk": b"x"})
    with pytest.raises(channel.ChannelError, match="unknown field"):
        channel.decode_from_child(raised)
    for forged in (Raised(1, "x" * (TEXT_CHARS + 1), ""), Raised(1, "", "x" * (DETAIL_CHARS + 1)),
                   Result(1, {}, {}, ["v"] * (MAX_NOTES + 1), []),
                   Result(1, {"out": WireTensor("float32", [1] * 9, b"")}, {}, [], []),
                   Booted(0, {"k" * 65: "v"})):
        with pytest.raises(channel.ChannelError):
            channel.decode_from_child(channel.encode(forged))


def test_the_text_budget_holds_the_largest_text_a_reply_may_carry():
    wide = "\U0001f600"  # four bytes in UTF-8: the most a character takes
    tensors = {f"{i:0>64}": WireTensor("float32", [0] * MAX_DIMS, b"") for i in range(MAX_TENSORS)}
    largest = [Result(1, tensors, {}, [wide * TEXT_CHARS] * MAX_NOTES, [wide * TEXT_CHARS] * MAX_NOTES,
                      wide * TEXT_CHARS), Raised(1, wide * TEXT_CHARS, wide * DETAIL_CHARS)]
    for message in largest:
        assert len(channel.encode(message)) <= channel.TEXT_BUDGET


@pytest.mark.parametrize(("wire", "problem"), [
    (WireTensor("float32", [(1 << 64) - 1, 0], b""), "where float32 \\[2, 3\\] was allocated"),
    (WireTensor("float16", [2, 3], b"\x00" * 12), "float16 \\[2, 3\\] where float32"),
    (WireTensor("float32", [3, 2], b"\x00" * 24), "float32 \\[3, 2\\] where"),
])
def test_a_tensor_is_rebuilt_only_as_the_layout_declares_it(wire, problem):
    with pytest.raises(channel.ChannelError, match=problem):
        channel.tensors_from_wire({"out": wire}, {"out": ((2, 3), torch.float32)})


def test_names_outside_the_layout_are_refused():
    good = channel.to_wire(torch.zeros(2, 3))
    layout = {"out": ((2, 3), torch.float32)}
    with pytest.raises(channel.ChannelError, match="not allocated"):
        channel.tensors_from_wire({"out": good, "evil": good}, layout)
    with pytest.raises(channel.ChannelError, match="lacks"):
        channel.tensors_from_wire({}, layout)
    assert torch.equal(channel.tensors_from_wire({"out": good}, layout)["out"], torch.zeros(2, 3))


def test_every_string_of_a_decoded_message_is_escaped():
    raw = Booted(0, {"uid\x1b[2J": "0\x1b]0;owned\x07\u202e"})
    clean = escaped(channel.decode_from_child(channel.encode(raw)))
    assert clean == Booted(0, {"uid\\x1b[2J": "0\\x1b]0;owned\\x07\\u202e"})
    tensor = WireTensor("float32", [1], b"\x1b\x00\x00\x00")
    assert escaped(Result(1, {"out": tensor}, {}, [], [])).outputs["out"].data == tensor.data  # bytes untouched


def test_escaping_keeps_only_plain_text():
    assert escape_controls("a\u00e9\u4e2d\u00a0!\U0001f600") == "a\u00e9\u4e2d\u00a0!\U0001f600"
    for hostile in ("\x1b", "\x9b", "\r", "\x7f", "\u200b", "\u2028", "\ue000", "\U000e0041", "\U0010ffff", "\u0378"):
        assert all(_plain(ch) for ch in escape_controls(hostile)), hostile


def test_bounded_keeps_the_head_and_the_tail():
    text = "ValueError: " + "x" * 10_000 + " the end"
    cut = bounded(text, 100)
    assert len(cut) == 100 and cut.startswith("ValueError: ") and cut.endswith(" the end") and "…" in cut
    assert len(describe(ValueError("y" * 8_000_000))) == TEXT_CHARS
