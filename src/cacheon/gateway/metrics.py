"""Prometheus metrics of one gateway: its own registry, KV ingest counters read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, Metric

_KV = ("batches", "events", "gaps", "replays", "replay_failures", "restarts", "reconnects", "clears")


class _KvCollector:
    """Sums each worker's feed counters; the KV threads own them, a scrape only reads."""

    def __init__(self, feeds: Callable[[], Iterable[tuple[str, dict[str, Any]]]]) -> None:
        self._feeds = feeds

    def collect(self) -> Iterable[Metric]:
        families = {k: CounterMetricFamily(f"cacheon_kv_{k}", f"KV ingest: {k}", labels=["worker"]) for k in _KV}
        rejects = CounterMetricFamily("cacheon_kv_rejects", "KV batches refused", labels=["worker", "reason"])
        for worker, counters in self._feeds():
            for k in _KV:
                families[k].add_metric([worker], counters.get(k, 0))
            for reason, n in counters.get("rejects", {}).items():
                rejects.add_metric([worker, reason], n)
        yield from families.values()
        yield rejects


class Metrics:
    def __init__(self, feeds: Callable[[], Iterable[tuple[str, dict[str, Any]]]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("cacheon_requests", "proxied requests", ["endpoint", "status"], registry=self.registry)
        self.decisions = Counter("cacheon_route_decisions", "routing decisions", ["policy", "reason"],
                                 registry=self.registry)
        self.prefix_hit_tokens = Counter("cacheon_prefix_hit_tokens",
                                         "prompt tokens the chosen worker holds, per routing decision",
                                         registry=self.registry)
        self.upstream_errors = Counter("cacheon_upstream_errors", "failed upstream attempts", ["worker"],
                                       registry=self.registry)
        self.registry.register(_KvCollector(feeds))
