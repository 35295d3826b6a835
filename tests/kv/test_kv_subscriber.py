"""Subscriber behaviour that needs no SGLang: malformed frames, a silent replay ROUTER, endpoints.
(Every release's real publisher runs against it in tests/interop.)"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import pytest
import zmq

from cacheon.errors import UsageError
from cacheon.kv.contracts import for_version
from cacheon.kv.index import BlockIndex
from cacheon.kv.subscriber import Delivery, Subscriber, rank_endpoint

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "kv_wire.json").read_text())
PIN = "0.5.13.post1"
STORED = base64.b64decode(FIXTURES[PIN]["stored_page"]["payload"])  # rank 0, stores block 11
EMPTY = base64.b64decode(FIXTURES[PIN]["cleared"]["payload"])
WAIT_S = 60.0


@pytest.fixture
def wire():
    """A bare PUB and a ROUTER that never answers, on free loopback ports."""
    ctx = zmq.Context()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    router_port = router.bind_to_random_port("tcp://127.0.0.1")
    yield pub, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{router_port}"
    pub.close(linger=0)
    router.close(linger=0)
    ctx.term()


def pump(subscriber: Subscriber, send, done) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, subscriber.counters()
        send()
        subscriber.poll(0.1)


def test_malformed_frames_are_rejected_and_change_nothing(wire) -> None:
    pub, endpoint, _ = wire
    index, seen = BlockIndex(), []
    subscriber = Subscriber(index, seen.append)
    try:
        subscriber.add_worker("w", endpoint, for_version(PIN), [0])
        pump(subscriber, lambda: pub.send_multipart([b"", STORED]), lambda: bool(seen))
    finally:
        subscriber.close()
    assert {(d.seq, d.reject.reason) for d in seen if d.reject} == {(-1, "decode_error")}
    assert index.longest_prefix([11]) == {}


def test_a_hole_the_router_will_not_fill_clears_the_rank_and_backs_off(wire) -> None:
    pub, endpoint, replay = wire
    index, seen = BlockIndex(), []
    subscriber = Subscriber(index, seen.append, replay_timeout_s=0.3)
    try:
        (feed,) = subscriber.add_worker("w", endpoint, for_version(PIN), [0], replay_base=replay)
        seq = iter(range(100, 10_000))
        pump(
            subscriber,
            lambda: pub.send_multipart([b"", next(seq).to_bytes(8, "big"), STORED]),
            lambda: index.longest_prefix([11]) != {},
        )
        time.sleep(0.5)  # let the first-contact replay's back-off (0.1 s) run out
        before = dict(vars(feed.counters))
        hole = feed.expected + 5
        pub.send_multipart([b"", hole.to_bytes(8, "big"), EMPTY])
        pump(subscriber, lambda: None, lambda: feed.expected == hole + 1)
        after = dict(vars(feed.counters))
        assert after["gaps"] - before["gaps"] == 1
        assert after["replays"] - before["replays"] == 1
        assert after["replay_failures"] - before["replay_failures"] == 1
        assert after["clears"] - before["clears"] == 1
        # Backing off: the next hole is not replayed, but the rank is still dropped.
        pub.send_multipart([b"", (hole + 3).to_bytes(8, "big"), STORED])
        pump(subscriber, lambda: None, lambda: feed.expected == hole + 4)
        assert vars(feed.counters)["replays"] == after["replays"]
        assert vars(feed.counters)["clears"] == after["clears"] + 1
    finally:
        subscriber.close()
    assert all(isinstance(d, Delivery) for d in seen)


def test_rank_endpoints() -> None:
    assert rank_endpoint("tcp://10.0.0.2:5557", 3) == "tcp://10.0.0.2:5560"
    assert rank_endpoint("tcp://[::1]:5557", 1) == "tcp://[::1]:5558"
    for bad in ("10.0.0.2:5557", "tcp://host", "tcp://:5557", "ipc:///tmp/kv", "tcp://h:65535"):
        with pytest.raises(UsageError):
            rank_endpoint(bad, 1)


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


PUBLISHER = """
import sys, time, zmq
ctx = zmq.Context(); pub = ctx.socket(zmq.PUB); pub.bind(sys.argv[1])
huge, stored = b"x" * int(sys.argv[2]), bytes.fromhex(sys.argv[3])
for line in sys.stdin:  # one command per line: "huge" or "stored SEQ"
    if line.startswith("huge"):
        pub.send_multipart([b"", (1).to_bytes(8, "big"), huge])
    else:
        pub.send_multipart([b"", int(line.split()[1]).to_bytes(8, "big"), stored])
"""


def test_a_frame_past_the_payload_bound_is_refused_by_zmq_before_it_is_buffered(tmp_path: Path) -> None:
    """A 100 MiB frame from a real publisher (another process): libzmq's MAXMSGSIZE drops the peer at the
    frame's header, so the subscriber's memory does not grow by the frame (it did by ~2x its size), the frame
    never reaches the decoder, and the next batch after the reconnect is indexed."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, endpoint, str(100 << 20), STORED.hex()],
                           stdin=subprocess.PIPE, text=True)
    index, seen = BlockIndex(), []
    subscriber = Subscriber(index, seen.append)
    try:
        (feed,) = subscriber.add_worker("w", endpoint, for_version(PIN), [0])
        assert feed.socket.sub.getsockopt(zmq.MAXMSGSIZE) == 16 << 20  # WireBounds().max_payload_bytes
        assert pub.stdin is not None
        seq = iter(range(10, 10_000))

        def send(command: str) -> None:
            pub.stdin.write(command + "\n")
            pub.stdin.flush()

        pump(subscriber, lambda: send(f"stored {next(seq)}"), lambda: bool(seen))  # connected and subscribed
        before, reconnects, count = _rss_bytes(), feed.counters.reconnects, len(seen)
        send("huge")
        # Dropped and dialled again; without MAXMSGSIZE the frame arrives instead (and is refused, late).
        pump(subscriber, lambda: None, lambda: feed.counters.reconnects > reconnects or len(seen) > count)
        grown = _rss_bytes() - before
        assert grown < 32 << 20, f"RSS grew by {grown >> 20} MiB receiving a frame ZMQ should have refused"
        assert not any(d.reject for d in seen), [d.reject for d in seen if d.reject]
        count = len(seen)
        pump(subscriber, lambda: send(f"stored {next(seq)}"), lambda: len(seen) > count)  # and it recovered
    finally:
        subscriber.close()
        pub.kill()
        pub.wait()
    assert index.longest_prefix([11]) != {}


def test_a_quiet_publisher_costs_no_wake_ups_and_stop_ends_the_sleep(wire, monkeypatch) -> None:
    """``run`` sleeps in the poll while nothing comes (no tick: a 50 ms one woke each worker's thread 20 times
    a second), wakes for a batch, and ``stop`` from another thread ends the sleep at once."""
    pub, endpoint, _ = wire
    index, seen, polls = BlockIndex(), [], []
    subscriber = Subscriber(index, seen.append)
    inner = subscriber.poll
    monkeypatch.setattr(subscriber, "poll", lambda timeout_s: polls.append(timeout_s) or inner(timeout_s))
    subscriber.add_worker("w", endpoint, for_version(PIN), [0])
    thread = threading.Thread(target=subscriber.run, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)  # connected meanwhile: the monitor's one event
        quiet = len(polls)
        time.sleep(0.6)
        assert len(polls) == quiet, f"{len(polls) - quiet} polls in 0.6 s of silence"
        deadline = time.monotonic() + WAIT_S
        while not seen:  # a PUB drops what it sends before the subscription reaches it: send until one lands
            assert time.monotonic() < deadline
            pub.send_multipart([b"", (1).to_bytes(8, "big"), STORED])
            time.sleep(0.05)
        assert index.longest_prefix([11]) == {("w", 0): 1}
        started = time.monotonic()
        subscriber.stop()
        thread.join(5)
        assert not thread.is_alive() and time.monotonic() - started < 0.5
    finally:
        subscriber.stop()
        thread.join(5)
        subscriber.close()
