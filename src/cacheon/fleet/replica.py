"""One worker's index rebuilt from the event plane: a snapshot, then its envelopes in stream order.

The relay and every gateway run this same code on the same envelopes, so their indexes (and
digests) agree. Per rank it keeps the epoch and the last publisher sequence applied: a reset
starts a new epoch and clears the rank; a batch of an older epoch is ignored (a relay that lost
its worker and has not noticed); a batch that does not follow the last one in its epoch means the
stream lost envelopes (retention, a purge): the rank's inventory is unknown, so it is cleared and
counted as a gap, never trusted. A batch already applied (a redelivery) is skipped. An envelope's
batches are taken one by one under these rules, each at its own publisher sequence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from cacheon.fleet.envelope import Envelope, Kind, RankBlocks, RankCursor, Snapshot
from cacheon.kv.contracts import WireContract
from cacheon.kv.feed import Delivery, FeedCounters, Source
from cacheon.kv.index import BlockIndex, IndexOp, PrefixIndex
from cacheon.kv.wire import (
    RANK_MISMATCH,
    SCHEMA_MISMATCH,
    DecodedBatch,
    WireBounds,
    WireDecoder,
    WireReject,
    operations,
)


class WorkerReplica:
    """Apply one worker's envelopes to ``index``; ``on_delivery`` sees each batch as a direct feed would."""

    def __init__(self, worker: str, contract: WireContract, index: PrefixIndex[Source], *,
                 bounds: WireBounds | None = None, on_delivery: Callable[[Delivery], None] | None = None,
                 source_id: str | None = None, dp_size: int | None = None) -> None:
        """``worker``: its name on the plane; ``source_id``: its id in ``index`` (default: the same);
        ``dp_size``: its ranks, an envelope for any other is refused (None: any rank)."""
        self.worker, self.contract, self.index = worker, contract, index
        self.source_id = source_id or worker
        self.dp_size = dp_size
        self.decoder = WireDecoder(contract, bounds)
        self.on_delivery = on_delivery
        self.cursors: dict[int, RankCursor] = {}
        self.stream_seq = 0  # the last stream sequence applied for this worker
        self.counters = FeedCounters()
        self.stale_epochs = 0  # batches of an epoch older than the rank's: ignored
        self.duplicates = 0  # batches already applied: skipped
        self.heard: float | None = None  # time.time() of the last envelope or heartbeat
        self.lag_s: float | None = None

    def load(self, snap: Snapshot) -> None:
        """Start from a snapshot (replacing what the ranks it names hold)."""
        for part in snap.ranks:
            source = (self.source_id, part.rank)
            self.index.clear(source)
            if part.blocks:
                self.index.apply(source, [(IndexOp.STORE, part.blocks, None)])
            self.cursors[part.rank] = RankCursor(part.cursor.epoch, part.cursor.last)
        self.stream_seq = snap.stream_seq

    def snapshot(self, index: BlockIndex[Source]) -> Snapshot:
        """This worker's state as of ``stream_seq`` (the relay's own ``BlockIndex``)."""
        ranks = [RankBlocks(rank, RankCursor(c.epoch, c.last), index.inventory((self.source_id, rank)))
                 for rank, c in sorted(self.cursors.items())]
        return Snapshot(self.worker, self.contract.id, self.stream_seq, ranks)

    def heartbeat(self, now: float | None = None) -> None:
        self.heard = time.time() if now is None else now

    def apply(self, env: Envelope, stream_seq: int, decoded: Sequence[DecodedBatch | None] | None = None) -> None:
        """One envelope, stored at ``stream_seq``; envelopes at or before ``stream_seq`` already applied are skipped.
        ``decoded``: its payloads as the relay's own feed accepted them (same bytes, contract, rank and bounds), so
        the relay does not decode each batch twice; a gateway never passes it (it trusts no relay's decoding)."""
        if stream_seq <= self.stream_seq:
            self.duplicates += 1
            return
        self.stream_seq = stream_seq
        self.heartbeat()
        if env.rank < 0 or (self.dp_size is not None and env.rank >= self.dp_size):
            self.counters.rejects[RANK_MISMATCH] += 1  # never an index source the worker's removal would not drop
            return
        source = (self.source_id, env.rank)
        if env.kind is Kind.RESET:
            self.cursors[env.rank] = RankCursor(stream_seq)
            self._clear(source)
            self.counters.restarts += 1
            return
        for i, payload in enumerate(env.payloads):
            self._batch(source, env, env.seq + i, payload, None if decoded is None else decoded[i])

    def _batch(self, source: Source, env: Envelope, seq: int, payload: bytes, decoded: DecodedBatch | None) -> None:
        cursor = self.cursors.get(env.rank)
        if cursor is not None and env.epoch < cursor.epoch:
            self.stale_epochs += 1
            return
        if cursor is None or env.epoch > cursor.epoch or (cursor.last is not None and seq > cursor.last + 1):
            # Its epoch's start or the batches between were not seen: what the rank holds is unknown.
            self.counters.gaps += 1
            self._clear(source)
            cursor = self.cursors[env.rank] = RankCursor(env.epoch)
        elif cursor.last is not None and seq <= cursor.last:
            self.duplicates += 1
            return
        cursor.last = seq
        self._deliver(source, env, seq, payload, decoded)

    def _clear(self, source: Source) -> None:
        self.counters.clears += 1
        self.index.clear(source)

    def _deliver(self, source: Source, env: Envelope, seq: int, payload: bytes, decoded: DecodedBatch | None) -> None:
        try:
            if env.contract != self.contract.id:
                raise WireReject(SCHEMA_MISMATCH, f"relayed under {env.contract}, the worker speaks {self.contract.id}")
            batch = decoded if decoded is not None else self.decoder.decode(payload, env.rank)
        except WireReject as reject:
            self.counters.rejects[reject.reason] += 1
            if self.on_delivery is not None:
                self.on_delivery(Delivery(source, seq, None, reject, False))
            return
        ops, skipped = operations(batch.events)
        self.index.apply(source, ops)
        self.lag_s = time.time() - batch.ts
        self.counters.batches += 1
        self.counters.events += len(batch.events)
        self.counters.skipped_events += skipped
        if self.on_delivery is not None:
            self.on_delivery(Delivery(source, seq, batch, None, False))
