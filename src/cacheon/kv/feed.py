"""One publisher's stream past the socket: sequence, replay, decode, index, counters.

No sockets here: the subscriber hands in live messages and reconnects, and the feed executes the
sequencer's decisions with an injected replayer. So the whole ingest path can be driven in a test.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from cacheon.kv.contracts import WireContract
from cacheon.kv.index import PrefixIndex
from cacheon.kv.replay import SKIPPED, Replayer, ReplayStatus
from cacheon.kv.sequencer import Continuity, Sequencer, Step
from cacheon.kv.wire import (
    DECODE_ERROR,
    DecodedBatch,
    RejectReason,
    WireBounds,
    WireDecoder,
    WireReject,
    operations,
)

Source = tuple[str, int]  # (worker id, DP rank): one publisher
log = logging.getLogger("cacheon.kv")


@dataclass
class FeedCounters:
    """What one publisher's stream did; the gateway reads these to decide what to trust."""

    batches: int = 0  # accepted batches (live and replayed)
    events: int = 0  # events in accepted batches
    skipped_events: int = 0  # accepted events on a non-device medium, not indexed
    rejects: Counter[RejectReason] = field(default_factory=Counter)  # by reason code
    gaps: int = 0  # forward jumps in seq
    replays: int = 0  # replay requests sent
    replay_failures: int = 0  # replays that timed out, were malformed or came back incomplete
    restarts: int = 0  # seq went backwards
    reconnects: int = 0  # the SUB's connection dropped and came back
    clears: int = 0  # times this rank's blocks were dropped (restart, unrecoverable hole, resync)
    resyncs: int = 0  # jumps past max_replay: cleared and rebuilt from the newest batches

    def add(self, other: FeedCounters) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: v for k, v in vars(self).items() if k != "rejects"}
        out["rejects"] = dict(sorted(self.rejects.items()))
        return out


@dataclass(frozen=True)
class Delivery:
    """One batch as the feed saw it: accepted (``batch``) or refused whole (``reject``)."""

    source: Source
    seq: int
    batch: DecodedBatch | None
    reject: WireReject | None
    replayed: bool
    payload: bytes = b""  # the publisher's bytes, for a relay that forwards accepted batches as received


class Feed:
    """One publisher's ingest; ``index`` and ``on_delivery`` are where accepted batches go."""

    def __init__(self, source: Source, contract: WireContract, *, replayer: Replayer | None = None,
                 index: PrefixIndex[Source] | None = None,
                 on_delivery: Callable[[Delivery], None] | None = None,
                 on_clear: Callable[[Source, str], None] | None = None,
                 bounds: WireBounds | None = None, max_replay: int = 10_000) -> None:
        self.source, self.rank, self.contract = source, source[1], contract
        self.decoder = WireDecoder(contract, bounds)
        self.counters = FeedCounters()
        self.sequencer = Sequencer(max_replay)
        self.lag_s: float | None = None  # receive time - timestamp of the newest live batch accepted
        self._replayer, self._index, self._on_delivery, self._on_clear = replayer, index, on_delivery, on_clear

    @property
    def expected(self) -> int | None:
        """The next seq this feed expects; None before first contact."""
        return self.sequencer.expected

    def on_reconnect(self) -> None:
        self.counters.reconnects += 1
        self.sequencer.reconnected()
        log.info("KV feed reconnected", extra={"fields": self._where()})

    def on_malformed(self, frames: list[bytes]) -> None:
        self._reject(-1, WireReject(DECODE_ERROR, f"live message has {len(frames)} frames"), False)

    def on_live(self, seq: int, payload: bytes) -> None:
        step = self.sequencer.step(seq)
        self.counters.gaps += step.continuity is Continuity.GAP
        self.counters.restarts += step.continuity is Continuity.RESTART
        self.counters.resyncs += step.resync
        if step.clear:
            self._clear("resync" if step.resync else str(step.continuity))
        if step.hole:
            replayed = self._replayer.fetch(step.hole) if self._replayer is not None else SKIPPED
            self.counters.replays += replayed.status is not ReplayStatus.SKIPPED
            self.counters.replay_failures += replayed.status is ReplayStatus.FAILED
            cleared = step.unfilled(replayed.seqs)
            if cleared:
                self.counters.replay_failures += replayed.status is ReplayStatus.DONE  # came back incomplete
                if not step.clear:
                    self._clear("hole")
            self._log_hole(step, replayed.status, len(replayed.batches), cleared)
            for s, p in replayed.batches:
                self._deliver(s, p, replayed=True)
        elif step.clear:
            self._log_hole(step, None, 0, True)
        self._deliver(seq, payload, replayed=False)

    def _where(self) -> dict[str, object]:
        return {"worker": self.source[0], "rank": self.rank}

    def _log_hole(self, step: Step, status: ReplayStatus | None, got: int, cleared: bool) -> None:
        """Gaps, restarts and resyncs at WARNING; first contact's slow-joiner hole at DEBUG."""
        quiet = step.continuity is Continuity.FIRST and not step.clear
        level = logging.DEBUG if quiet else logging.WARNING
        if not log.isEnabledFor(level):
            return
        what = "resync" if step.resync else str(step.continuity)
        fields = {**self._where(), "seq": step.seq, "event": what, "missing": len(step.hole),
                  "replay": status, "replayed": got, "cleared": cleared or step.clear}
        log.log(level, f"KV feed {what}", extra={"fields": fields})

    def _clear(self, why: str) -> None:
        """Forget the rank's blocks; ``on_clear`` hears why (restart, gap, first, resync, hole), in order
        with the deliveries."""
        self.counters.clears += 1
        if self._index is not None:
            self._index.clear(self.source)
        if self._on_clear is not None:
            self._on_clear(self.source, why)

    def _deliver(self, seq: int, payload: bytes, replayed: bool) -> None:
        try:
            batch = self.decoder.decode(payload, self.rank)
        except WireReject as reject:
            self._reject(seq, reject, replayed)
            return
        ops, skipped = operations(batch.events)
        if self._index is not None:
            self._index.apply(self.source, ops)
        if not replayed:
            self.lag_s = time.time() - batch.ts
        self.counters.batches += 1
        self.counters.events += len(batch.events)
        self.counters.skipped_events += skipped
        if self._on_delivery is not None:
            self._on_delivery(Delivery(self.source, seq, batch, None, replayed, payload))

    def _reject(self, seq: int, reject: WireReject, replayed: bool) -> None:
        self.counters.rejects[reject.reason] += 1
        n = self.counters.rejects[reject.reason]
        if str(n).strip("0") == "1":  # the 1st, 10th, 100th... of a reason: a flood cannot flood the log
            log.warning("KV batch refused", extra={"fields": {**self._where(), "seq": seq, "reason": reject.reason,
                                                               "detail": reject.detail[:300], "count": n}})
        if self._on_delivery is not None:
            self._on_delivery(Delivery(self.source, seq, None, reject, replayed))
