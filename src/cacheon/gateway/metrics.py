"""Prometheus metrics of one gateway: its own registry; worker, KV and cache state read at scrape time.

The request path observes a few counters and histograms (``Proxy._record``); everything else is
collected when scraped from what the fleet, the feeds, the profiles and the chain cache keep
anyway, so a scrape only reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cacheon.gateway.precision import Match, Precision
from cacheon.gateway.workers import WorkerState
from cacheon.kv.feed import FeedCounters
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile

_KV = ("batches", "events", "gaps", "replays", "replay_failures", "restarts", "reconnects", "clears", "resyncs")
# Proxy overhead is sub-millisecond, a generation may take minutes: buckets span both.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                   300.0)


@dataclass(frozen=True)
class WorkerView:
    """One worker as a scrape sees it."""

    id: str
    state: WorkerState
    in_flight: int
    healthy: bool
    draining: bool
    indexed_blocks: int
    digest: str | None  # the index digest (hex); None while not subscribed
    feeds: FeedCounters
    event_lag_s: float | None  # now - the newest accepted batch's timestamp; None before one
    precision: Precision
    kv_stale: bool = False  # event plane: not heard from (events or heartbeat) within staleness_s


Workers = Callable[[], Iterable[WorkerView]]


def digest_value(digest: str) -> float:
    """The digest's first 48 bits as a gauge value: exact in a float64, so replicas compare equal."""
    return float(int(digest[:12], 16))


class _WorkerCollector:
    """Per-worker gauges and the KV feeds' counters; the KV threads own the counters, a scrape reads."""

    def __init__(self, workers: Workers) -> None:
        self._workers = workers

    def collect(self) -> Iterable[Metric]:
        kv = {k: CounterMetricFamily(f"cacheon_kv_{k}", f"KV ingest: {k}", labels=["worker"]) for k in _KV}
        rejects = CounterMetricFamily("cacheon_kv_rejects", "KV batches refused whole", labels=["worker", "reason"])
        state = GaugeMetricFamily("cacheon_worker_state", "1 for the worker's ladder state, 0 for the others",
                                  labels=["worker", "state"])
        in_flight = GaugeMetricFamily("cacheon_worker_in_flight", "requests in flight", labels=["worker"])
        up = GaugeMetricFamily("cacheon_worker_available", "1 while healthy and not draining", labels=["worker"])
        blocks = GaugeMetricFamily("cacheon_index_blocks", "KV blocks indexed for the worker (all ranks)",
                                   labels=["worker"])
        digest = GaugeMetricFamily("cacheon_index_digest", "the worker's index digest, first 48 bits "
                                   "(equal across replicas with the same view)", labels=["worker"])
        lag = GaugeMetricFamily("cacheon_kv_event_lag_seconds", "now - timestamp of the newest accepted batch "
                                "(publisher clock)", labels=["worker"])
        stale = GaugeMetricFamily("cacheon_worker_kv_stale", "1 while the event plane has not been heard from for "
                                  "the worker within staleness_s (not routed to)", labels=["worker"])
        scored = CounterMetricFamily("cacheon_prediction_scored", "answered requests whose predicted cached tokens "
                                     "were compared with the engine's report, by match", labels=["worker", "match"])
        predicted = CounterMetricFamily("cacheon_predicted_cached_tokens", "cached prompt tokens predicted, "
                                        "over scored requests", labels=["worker"])
        reported = CounterMetricFamily("cacheon_reported_cached_tokens", "cached prompt tokens the engine "
                                       "reported, over scored requests", labels=["worker"])
        unreported = CounterMetricFamily("cacheon_prediction_unreported", "predicted requests whose answer "
                                         "carried no cached-token count", labels=["worker"])
        refusals = CounterMetricFamily("cacheon_prediction_refusals", "answered requests nothing was predicted "
                                       "for, by reason", labels=["worker", "reason"])
        for w in self._workers():
            p = w.precision
            for match in Match:
                scored.add_metric([w.id, match], p.scored[match])
            predicted.add_metric([w.id], p.predicted_tokens)
            reported.add_metric([w.id], p.reported_tokens)
            unreported.add_metric([w.id], p.unreported)
            for refusal, n in sorted(dict(p.refusals).items()):  # a copy: the loop may add a reason meanwhile
                refusals.add_metric([w.id, refusal], n)
            for k in _KV:
                kv[k].add_metric([w.id], getattr(w.feeds, k))
            for reason, n in sorted(w.feeds.rejects.items()):
                rejects.add_metric([w.id, reason], n)
            for s in WorkerState:
                state.add_metric([w.id, s], 1.0 if s == w.state else 0.0)
            in_flight.add_metric([w.id], w.in_flight)
            up.add_metric([w.id], 1.0 if w.healthy and not w.draining else 0.0)
            blocks.add_metric([w.id], w.indexed_blocks)
            if w.digest is not None:
                digest.add_metric([w.id], digest_value(w.digest))
            if w.event_lag_s is not None:
                lag.add_metric([w.id], w.event_lag_s)
            stale.add_metric([w.id], 1.0 if w.kv_stale else 0.0)
        yield from kv.values()
        yield from (rejects, state, in_flight, up, blocks, digest, lag, stale, scored, predicted, reported, unreported,
                    refusals)


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


class _UptimeCollector:
    def __init__(self) -> None:
        self._started = time.time()

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("cacheon_gateway_start_time_seconds", "when this gateway process started")
        family.add_metric([], self._started)
        yield family


class Metrics:
    def __init__(self, workers: Workers, profiles: dict[str, TokenizerProfile], chains: ChainCache) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("cacheon_requests", "proxied requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.rejects = Counter("cacheon_request_rejects", "requests answered by the gateway itself, by reason",
                               ["reason"], registry=r)
        self.latency = Histogram("cacheon_request_duration_seconds", "request latency, arrival to last byte",
                                 ["worker", "model", "route"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("cacheon_time_to_first_token_seconds", "streamed requests: arrival to first chunk",
                              ["worker", "model", "route"], buckets=LATENCY_BUCKETS, registry=r)
        self.decisions = Counter("cacheon_route_decisions", "routing decisions", ["policy", "reason"], registry=r)
        self.prefix_hit_tokens = Counter("cacheon_prefix_hit_tokens",
                                         "prompt tokens the chosen worker holds, per routing decision", registry=r)
        self.upstream_errors = Counter("cacheon_upstream_errors", "failed upstream attempts", ["worker"], registry=r)
        r.register(_WorkerCollector(workers))
        r.register(_TokenCacheCollector(profiles, chains))
        r.register(_UptimeCollector())
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
