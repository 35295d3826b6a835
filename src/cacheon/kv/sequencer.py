"""Sequence numbers are the truth about completeness: what to do with each live message of one publisher.

Pure: no sockets, no clock. Per publisher: the next expected ``seq`` arrives -> apply; a jump ->
replay the hole, then apply; a step back -> the worker restarted: clear that rank's blocks first.
A dropped and re-made TCP connection is treated like a restart, since a new process can already
be past the old sequence. On first contact the hole before the first message (ZMQ's slow joiner)
is replayed best effort. A hole that matters and cannot be replayed leaves the rank's inventory
unknown, so it is cleared rather than trusted. What a hole asks the replay endpoint for is
bounded (``max_replay``): a jump past the bound is a *resync*, the rank cleared and rebuilt from
the newest ``max_replay`` batches, never one request (or one allocation) per missing number.
The feed executes these decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Continuity(StrEnum):
    FIRST = "first"  # no sequence known yet (first contact, or the first message after a reconnect)
    NEXT = "next"  # exactly the expected seq
    GAP = "gap"  # ahead of the expected seq: messages were lost
    RESTART = "restart"  # behind it: a new publisher process counts from 0 again


@dataclass(frozen=True)
class Step:
    """The decision for one live message, taken before it is applied."""

    seq: int
    continuity: Continuity
    clear: bool  # drop the rank's blocks before anything else
    hole: range  # the seqs missing before this one, to replay (empty: none); at most max_replay long
    must_fill: bool  # whether an unfilled hole leaves the rank's inventory unknown
    resync: bool = False  # the jump was past max_replay: cleared, and only its newest part is replayed

    def unfilled(self, replayed: Sequence[int] | None) -> bool:
        """Whether the hole mattered and the replay (the seqs it brought; None: none could be had)
        did not fill it exactly: the rank must then be cleared, unless this step clears it already."""
        return bool(self.hole) and self.must_fill and (replayed is None or list(replayed) != list(self.hole))


class Sequencer:
    """One publisher's sequence state."""

    def __init__(self, max_replay: int = 10_000) -> None:
        if max_replay < 1:
            raise ValueError("max_replay must be >= 1")
        self.max_replay = max_replay
        self.expected: int | None = None
        self._resync = False

    def reconnected(self) -> None:
        """The connection dropped and came back: the next message starts over."""
        self._resync = True

    def step(self, seq: int) -> Step:
        """Decide what ``seq`` means, and expect the one after it."""
        clear = False
        if self._resync and self.expected is not None:
            clear, self.expected = True, None
        self._resync = False
        if self.expected is None:
            continuity, start, must_fill = Continuity.FIRST, 0, False
        elif seq >= self.expected:
            continuity = Continuity.GAP if seq > self.expected else Continuity.NEXT
            start, must_fill = self.expected, True
        else:
            continuity, start, must_fill, clear = Continuity.RESTART, 0, True, True
        self.expected = seq + 1
        resync = False
        if seq - start > self.max_replay:  # not len(range): a u64 jump overflows it
            start = seq - self.max_replay
            resync, clear, must_fill = must_fill and not clear, clear or must_fill, False
        return Step(seq, continuity, clear, range(start, seq), must_fill, resync)
