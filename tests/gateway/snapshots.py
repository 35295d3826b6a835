"""Policies see frozen snapshots of workers (``Candidate``); tests keep mutable ``Worker``s and ask
through ``choose``, which maps the decision back to the worker as the proxy does."""

from __future__ import annotations

from collections.abc import Sequence

from cacheon.gateway.policy import Decision, Policy, snapshot
from cacheon.gateway.prediction import Reuse
from cacheon.gateway.workers import Worker


def choose(policy: Policy, workers: Sequence[Worker], tokens: Sequence[int] | None,
           reuse: Reuse | None = None) -> Decision:
    decision = policy.choose(snapshot(workers), tokens, reuse)
    return decision._replace(worker=next(w for w in workers if w.id == decision.worker.id))
