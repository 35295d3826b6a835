"""Names on the event plane: subjects, message ids, object and lease keys, all derived from a worker id.

A worker id is whatever the operator named it (``workers[].id``, else its URL), so it may hold
dots, slashes or spaces that NATS subjects and keys refuse. Its token keeps the safe characters
for reading and appends a digest of the whole id, so two ids never share a token and every
relay and gateway derives the same one.
"""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def token(worker: str) -> str:
    """A subject-, key- and object-name-safe token for ``worker``, deterministic and injective in practice."""
    return f"{_UNSAFE.sub('_', worker)[:40]}-{hashlib.sha256(worker.encode()).hexdigest()[:12]}"


def batches(stream: str, worker: str, rank: int) -> str:
    """Where one publisher's (worker, DP rank) batches and resets go: ``<stream>.<token>.<rank>``."""
    return f"{stream}.{token(worker)}.{rank}"


def worker_filter(stream: str, worker: str) -> str:
    """Every rank of one worker."""
    return f"{stream}.{token(worker)}.*"


def stream_subjects(stream: str) -> list[str]:
    return [f"{stream}.*.*"]


def heartbeat(stream: str, worker: str) -> str:
    """Core NATS (outside the stream, never stored): a relay's 'still following this worker'."""
    return f"{stream}-hb.{token(worker)}"


def batch_id(worker: str, rank: int, epoch: int, first: int, last: int) -> str:
    """``Nats-Msg-Id`` of an envelope of batches ``first..last``: one republished falls in JetStream's duplicate window
    and is dropped."""
    return f"{worker}/{rank}/{epoch}/{first}-{last}"


def reset_id(worker: str, rank: int, relay: str, n: int) -> str:
    """``Nats-Msg-Id`` of a reset: one per relay instance and reset, so a retried publish is one reset."""
    return f"{worker}/{rank}/reset/{relay}/{n}"


def leases_bucket(stream: str) -> str:
    return f"{stream}-leases"
