"""Fetch a hole of one publisher's stream from its replay ROUTER (SGLang's ``replay_endpoint``).

A DEALER sends ``[b"", start_seq]``; the ROUTER answers every batch it still holds from there,
then an end marker, in the contract's framing. A silent or foreign ROUTER is backed off from
(0.1 s doubling to 5 s) so a dead replay socket cannot stall live ingest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import zmq

from cacheon.kv.contracts import ReplayFraming

END_SEQ = b"\xff" * 8  # SGLang's replay terminator: (-1).to_bytes(8, "big", signed=True)
END = (-1, b"")


class ReplayStatus(StrEnum):
    SKIPPED = "skipped"  # no replay endpoint, or backing off after a failure: nothing was asked
    FAILED = "failed"  # timed out, or a reply in a framing this contract does not speak
    DONE = "done"  # the ROUTER answered up to its end marker (possibly without the whole hole)


@dataclass(frozen=True)
class Replayed:
    status: ReplayStatus
    batches: list[tuple[int, bytes]] = field(default_factory=list)  # (seq, payload) inside the hole

    @property
    def seqs(self) -> list[int] | None:
        """The seqs brought back; None when nothing came back at all."""
        return [s for s, _ in self.batches] if self.status is ReplayStatus.DONE else None


SKIPPED = Replayed(ReplayStatus.SKIPPED)


class Replayer(Protocol):
    def fetch(self, hole: range) -> Replayed: ...


def parse_reply(frames: list[bytes], framing: ReplayFraming, topic: bytes) -> tuple[int, bytes] | None:
    """``(seq, payload)``, ``END`` at the end marker, None for a reply in another framing."""
    if framing == ReplayFraming.TOPIC_SEQ:  # [b"", topic, seq, payload]
        if len(frames) != 4 or frames[0] != b"":
            return None
        their_topic, seq, payload = frames[1:]
        if their_topic == b"" and seq == END_SEQ and payload == b"":
            return END
        if not their_topic.startswith(topic):
            return None
    else:  # [b"", seq, payload]
        if len(frames) != 3 or frames[0] != b"":
            return None
        seq, payload = frames[1:]
        if seq == END_SEQ and payload == b"":
            return END
    if len(seq) != 8:
        return None
    return int.from_bytes(seq, "big"), payload


class ReplayClient:
    """A DEALER to one publisher's ROUTER, made on first use and dropped after a failure."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, framing: ReplayFraming, topic: bytes,
                 *, max_frame_bytes: int, timeout_s: float = 2.0, backoff_s: tuple[float, float] = (0.1, 5.0)) -> None:
        self._ctx, self._endpoint, self._framing, self._topic = ctx, endpoint, framing, topic
        self._max_frame_bytes = max_frame_bytes  # the DEALER's MAXMSGSIZE, as on the live socket
        self._timeout_s = timeout_s
        self._backoff_min, self._backoff_max = backoff_s
        self._backoff = self._backoff_min
        self._not_before = 0.0
        self._dealer: zmq.Socket[bytes] | None = None

    def fetch(self, hole: range) -> Replayed:
        """The batches of ``hole`` the ROUTER still holds."""
        if time.monotonic() < self._not_before:
            return SKIPPED
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.setsockopt(zmq.MAXMSGSIZE, self._max_frame_bytes)
            self._dealer.connect(self._endpoint)
        self._dealer.send_multipart([b"", hole.start.to_bytes(8, "big")])
        got: dict[int, bytes] = {}  # by seq: a ROUTER repeating itself cannot grow this past the hole
        deadline = time.monotonic() + self._timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self._dealer.poll(remaining_ms):
                return self._failed()
            reply = parse_reply(self._dealer.recv_multipart(), self._framing, self._topic)
            if reply is None:
                return self._failed()
            if reply is END:
                break
            if reply[0] in hole:
                got.setdefault(reply[0], reply[1])
        self._backoff = self._backoff_min
        return Replayed(ReplayStatus.DONE, sorted(got.items()))

    def close(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None

    def _failed(self) -> Replayed:
        """Drop the DEALER (late replies die with it) and back off before the next try."""
        self.close()
        self._not_before = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._backoff_max)
        return Replayed(ReplayStatus.FAILED)
