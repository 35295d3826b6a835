"""How a request ended (``Outcome``), recorded in one place: metrics, the access log line, the trace
span and the answering worker's prediction score all hang off it. Every client-given string that
reaches a log line or a span is clipped (``refusals.clip``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiohttp import web

from cacheon.gateway.metrics import Metrics
from cacheon.gateway.policy import Decision
from cacheon.gateway.precision import StreamTail, reported_cached
from cacheon.gateway.prediction import NoPrediction
from cacheon.gateway.prompt import Route
from cacheon.gateway.refusals import Refusal
from cacheon.gateway.tracing import Tracing
from cacheon.gateway.workers import Worker
from cacheon.tokens.profile import TokenizerProfile

log = logging.getLogger("cacheon.access")
CLIENT_GONE = 499  # nginx's code for a client that closed the connection first


class Attempt(NamedTuple):
    """One try at a worker: the worker, and the policy's decision (made on its snapshot)."""

    worker: Worker
    decision: Decision


@dataclass
class Outcome:
    """How one request ended: its answer, the attempts that led there, and what they took."""

    endpoint: str
    request_id: str
    started: float  # perf_counter at arrival
    route: Route = Route.COMPLETION  # where the engine reports its cached tokens
    model: str | None = None  # as the client named it, clipped
    stream: bool = False
    prompt_tokens: int | None = None  # as the gateway tokenized it (None: not tokenized)
    response: web.StreamResponse | None = None
    status: int = 0  # what the client got (499: it left first)
    refusal: Refusal | None = None
    attempts: list[Attempt] = field(default_factory=list)  # in order
    failures: list[str] = field(default_factory=list)  # "worker: why" per failed attempt
    routed: float | None = None  # perf_counter of the first attempt's decision: decoded, tokenized, chosen
    first_chunk: float | None = None  # perf_counter of a stream's first upstream chunk
    error: str | None = None  # how a stream ended early, if it did
    refusal_reason: NoPrediction | None = None  # why nothing about this request's cache can be predicted
    tail: StreamTail | None = None  # a stream's last counting event, for scoring the prediction
    span: Any = None  # the trace span, when tracing is on


class Recorder:
    """Counts, logs, traces and scores each ``Outcome``; metric children are looked up once per label set."""

    def __init__(self, policy: str, metrics: Metrics, profiles: dict[str, TokenizerProfile],
                 tracing: Tracing | None) -> None:
        self.policy, self.metrics, self.profiles, self.tracing = policy, metrics, profiles, tracing
        self._series: dict[tuple[str, ...], Any] = {}

    def record(self, o: Outcome) -> None:
        status = o.status or (o.response.status if o.response is not None else 0)
        elapsed = time.perf_counter() - o.started
        self.child("requests", o.endpoint, str(status)).inc()
        last = o.attempts[-1] if o.attempts else None
        worker = last.worker.id if last else None
        route = f"{self.policy}:{last.decision.reason}" if last else None
        if o.refusal is not None:
            self.metrics.rejects.labels(o.refusal).inc()
        if last is not None and route is not None:
            model = self._model_label(o.model, last.worker)
            self.child("latency", last.worker.id, model, route).observe(elapsed)
            if o.first_chunk is not None:
                self.child("ttft", last.worker.id, model, route).observe(o.first_chunk - o.started)
        predicted = o.attempts[0].decision.held if o.attempts else None
        if last is not None and 200 <= status < 300:
            self._score(o, last)
        if log.isEnabledFor(logging.INFO):
            log.info(f"POST {o.endpoint} {status}", extra={"fields": {
                "request_id": o.request_id, "endpoint": o.endpoint, "model": o.model, "stream": o.stream,
                "status": status, "latency_ms": round(elapsed * 1e3, 3),
                "route_ms": None if o.routed is None else round((o.routed - o.started) * 1e3, 3),
                "ttft_ms": None if o.first_chunk is None else round((o.first_chunk - o.started) * 1e3, 3),
                "route": route, "worker": worker, "worker_url": last.worker.url if last else None,
                "prompt_tokens": o.prompt_tokens, "predicted_cached_tokens": predicted,
                "attempts": len(o.attempts), "failures": o.failures or None, "refusal": o.refusal,
                "error": o.error}})
        if o.span is not None and self.tracing is not None:
            self.tracing.finish(o.span, status=status, route=route, worker=worker, model=o.model,
                                predicted_cached_tokens=predicted, attempts=len(o.attempts), error=o.error)

    def child(self, metric: str, *labels: str) -> Any:
        """``metrics.<metric>.labels(*labels)``, looked up once per label set."""
        key = (metric, *labels)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = getattr(self.metrics, metric).labels(*labels)
        return found

    def _score(self, o: Outcome, answered: Attempt) -> None:
        """The answering worker's prediction against the cached tokens its engine reports."""
        decision, precision = answered.decision, answered.worker.precision
        if decision.refused is not None:
            precision.refused(decision.refused)
            return
        if not decision.predicted:
            return
        found = answered.worker.discovery
        body = o.tail.last if o.tail is not None else getattr(o.response, "body", None)
        reported = None if body is None or not isinstance(body, bytes) else reported_cached(
            o.route, body, found is None or found.cache_report)
        if reported is None:
            precision.unreported += 1
        else:
            precision.score(decision.held, reported, o.request_id)

    def _model_label(self, model: str | None, worker: Worker) -> str:
        """A bounded label: a configured or discovered model name, else ``other``."""
        if model is not None and (model in self.profiles or (worker.discovery and worker.discovery.model == model)):
            return model
        return "other"

