"""Prometheus metrics of one gateway: its own registry; KV and cache counters read at scrape time.

The collectors wrap what they measure from outside: the feeds, profiles and chain cache keep
plain counters, and a scrape only reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, Metric

from cacheon.kv.feed import FeedCounters
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile

_KV = ("batches", "events", "gaps", "replays", "replay_failures", "restarts", "reconnects", "clears")
Feeds = Callable[[], Iterable[tuple[str, FeedCounters]]]  # (worker id, its feeds' totals) per worker


class _KvCollector:
    """Sums each worker's feed counters; the KV threads own them, a scrape only reads."""

    def __init__(self, feeds: Feeds) -> None:
        self._feeds = feeds

    def collect(self) -> Iterable[Metric]:
        families = {k: CounterMetricFamily(f"cacheon_kv_{k}", f"KV ingest: {k}", labels=["worker"]) for k in _KV}
        rejects = CounterMetricFamily("cacheon_kv_rejects", "KV batches refused", labels=["worker", "reason"])
        for worker, counters in self._feeds():
            for k in _KV:
                families[k].add_metric([worker], getattr(counters, k))
            for reason, n in sorted(counters.rejects.items()):
                rejects.add_metric([worker, reason], n)
        yield from families.values()
        yield rejects


class _TokenCacheCollector:
    """The exact tokenization caches' counters, per model, and the gateway's hash-chain cache's."""

    def __init__(self, profiles: dict[str, TokenizerProfile], chains: ChainCache) -> None:
        self._profiles, self._chains = profiles, chains

    def collect(self) -> Iterable[Metric]:
        windows = CounterMetricFamily("cacheon_token_windows", "tokenization windows by outcome",
                                      labels=["model", "outcome"])
        stems = CounterMetricFamily("cacheon_token_stems", "prompts resumed from an earlier prompt's stem",
                                    labels=["model"])
        for model, profile in self._profiles.items():
            cache = profile.windows
            for outcome, n in (("hit", cache.hits), ("miss", cache.misses), ("fallback", cache.fallbacks)):
                windows.add_metric([model, outcome], n)
            stems.add_metric([model], cache.stem_hits)
        chains = CounterMetricFamily("cacheon_hash_chain_segments", "hash-chain cache lookups by outcome",
                                     labels=["outcome"])
        chains.add_metric(["hit"], self._chains.hits)
        chains.add_metric(["miss"], self._chains.misses)
        yield windows
        yield stems
        yield chains


class Metrics:
    def __init__(self, feeds: Feeds, profiles: dict[str, TokenizerProfile], chains: ChainCache) -> None:
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
        self.registry.register(_TokenCacheCollector(profiles, chains))
