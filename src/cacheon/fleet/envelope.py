"""What travels on the event plane: typed msgpack envelopes around the workers' own batches.

A batch envelope carries the publisher's *raw accepted payloads*, not re-encoded events: the
relay decodes each strictly to accept it, and every gateway decodes the same bytes again with the
same contract, so the plane adds no second event format to keep in step with SGLang's, a gateway
never trusts a relay's decoding, and the attestation ladder's echoes and the index see exactly
what a direct subscription would. One envelope holds a run of one rank's consecutive batches (publisher
sequences ``seq``, ``seq + 1``, ...: a hole cannot be expressed inside one), as many as the relay had
waiting: the plane's cost is per message (the client's publish and acknowledgement, ~80 µs), so a
burst costs one, and nothing waits to fill an envelope.

A reset marks a new *epoch* of one (worker, rank): the publisher restarted, a hole could not be
replayed, or a relay (re)started following it. Its epoch is the stream sequence of the reset
itself, so epochs only grow whichever relay writes them, and a batch of an older epoch (a relay
that lost its lease and has not noticed yet) is recognised and ignored.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from cacheon.kv.events import Int64


class Kind(StrEnum):
    BATCH = "batch"
    RESET = "reset"


class Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: Kind
    worker: str
    rank: int
    relay: str
    contract: str  # the wire contract id the relay accepted the payload under
    epoch: int = 0  # batch: the stream sequence of its epoch's reset; reset: 0 (its own sequence is the epoch)
    seq: int = -1  # batch: the publisher's sequence number of the first payload (the others follow it, one by one)
    payloads: tuple[bytes, ...] = ()  # batch: the publisher's payloads as received, in sequence order
    reason: str = ""  # reset: why (restart, reconnect, hole, resync, relay_start)


class Heartbeat(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    worker: str
    relay: str
    ts: float


class RankCursor(msgspec.Struct, forbid_unknown_fields=True):
    """Where one rank stands: its epoch and the last publisher sequence applied (None: none yet in it)."""

    epoch: int
    last: int | None = None


class RankBlocks(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    rank: int
    cursor: RankCursor
    blocks: list[Int64]  # held block ids in store order (closed under parents: stored as roots), int64 as on the wire


class Snapshot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One worker's index as of ``stream_seq`` (every envelope of the worker up to it applied)."""

    worker: str
    contract: str
    stream_seq: int
    ranks: list[RankBlocks]


envelope_encoder = msgspec.msgpack.Encoder()
envelope_decoder = msgspec.msgpack.Decoder(Envelope)
heartbeat_decoder = msgspec.msgpack.Decoder(Heartbeat)
snapshot_decoder = msgspec.msgpack.Decoder(Snapshot)
