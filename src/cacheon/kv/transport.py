"""One publisher's live stream: a ZMQ SUB on its port, with a monitor that sees reconnects.

SGLang publishes ``[topic, seq (u64 big-endian), payload]`` on ``base_port + rank`` per DP rank.
This module only moves frames: the feed (``cacheon.kv.feed``) decides what they mean. The
gateway's subscriber and ``cacheon kv listen`` read through the same socket.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from cacheon.errors import UsageError

_RECV_HWM = 100_000  # SGLang's default PUB high-water mark


def rank_endpoint(base: str, rank: int) -> str:
    """``tcp://host:port`` of DP rank ``rank``: SGLang binds rank r on ``base_port + r``."""
    host, sep, port = base.rpartition(":")
    if not base.startswith("tcp://") or not sep or not port.isdigit() or not host[len("tcp://") :]:
        raise UsageError(f"endpoint {base!r} is not tcp://HOST:PORT")
    if rank < 0 or int(port) + rank > 65535:
        raise UsageError(f"rank {rank} does not fit a port above {base!r}")
    return f"{host}:{int(port) + rank}"


@dataclass(frozen=True)
class Live:
    """A well-framed live message."""

    seq: int
    payload: bytes


@dataclass(frozen=True)
class Malformed:
    """A live message that is not ``[topic, seq, payload]``."""

    frames: list[bytes]


class LiveSocket:
    """SUB on one publisher's live port; libzmq reconnects by itself, backing off 100 ms to 5 s.

    ``max_frame_bytes`` is the socket's ``MAXMSGSIZE``: libzmq drops a peer announcing a larger
    frame before buffering it, so an oversized batch costs no memory. libzmq treats that as a
    protocol error and never dials that peer again, so every disconnect re-dials here (seen as a
    reconnect, as a publisher restart is).
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, topic: bytes, *, max_frame_bytes: int,
                 backoff_s: tuple[float, float] = (0.1, 5.0)) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        self.sub.setsockopt(zmq.RECONNECT_IVL, int(backoff_s[0] * 1000))
        self.sub.setsockopt(zmq.RECONNECT_IVL_MAX, int(backoff_s[1] * 1000))
        self.sub.setsockopt(zmq.RCVHWM, _RECV_HWM)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.monitor = self.sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.endpoint = endpoint
        self.sub.connect(endpoint)
        self._disconnected = False

    def reconnects(self) -> int:
        """Drain connection events without blocking: how many times the connection came back."""
        back = 0
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return back
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
                self.sub.disconnect(self.endpoint)  # a fresh session, which retries with the back-off
                self.sub.connect(self.endpoint)
            elif event["event"] == zmq.EVENT_CONNECTED and self._disconnected:
                self._disconnected = False
                back += 1

    def wait(self, timeout_s: float) -> bool:
        """Whether a message is waiting, within ``timeout_s``."""
        return bool(self.sub.poll(int(timeout_s * 1000)))

    def messages(self, limit: int) -> Iterator[Live | Malformed]:
        """Up to ``limit`` waiting messages, without blocking."""
        for _ in range(limit):
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or len(frames[1]) != 8:
                yield Malformed(frames)
            else:
                yield Live(int.from_bytes(frames[1], "big"), frames[2])

    def close(self) -> None:
        self.sub.disable_monitor()
        self.monitor.close(linger=0)
        self.sub.close(linger=0)
