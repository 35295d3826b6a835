"""The gateway's own dashboard: an HTML page on the admin listener, over the state ``/status`` reads.

The page and its script are static files shipped in the wheel (``gateway/static/``; no build
step, no CDN, charts drawn as plain SVG). They carry no data, so a browser opens them without
a header; everything shown comes from ``/dashboard/state``, which is behind the admin token like
the rest of the admin API (the page asks for the token, or takes it from ``#token=`` in its URL,
which the browser never sends to a server).

The state adds to ``/status`` what a page needs and ``/status`` does not keep: the request rate
and a latency histogram over the last minutes (sampled from the gateway's own Prometheus
counters every ``interval_s``), and the last refusals with their request ids (taken from the
access log's records, so they are seen while it logs at ``info``, the gateway's default; the access
log names no gateway, so two gateways in one process would see each other's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from itertools import pairwise
from typing import Any

import msgspec
from aiohttp import web

from cacheon.gateway.metrics import LATENCY_BUCKETS
from cacheon.gateway.service import Gateway

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WINDOW_S = 600.0  # what the charts span
INTERVAL_S = 5.0  # how often the counters are sampled
RECENT_REFUSALS = 50
#: the files under gateway/static/ the page is made of, and how each is served
STATIC = {"dashboard.html": "text/html", "dashboard.js": "text/javascript", "dashboard.css": "text/css",
          "favicon.svg": "image/svg+xml"}
_json = msgspec.json.Encoder()


@dataclass(frozen=True)
class Sample:
    """The gateway's request counters at one moment (cumulative, as Prometheus keeps them)."""

    at: float
    requests: float
    refusals: float
    buckets: tuple[float, ...]  # cumulative request counts at or under each LATENCY_BUCKETS bound, then +Inf


def sample(gw: Gateway) -> Sample:
    """Sum the request, refusal and latency series over their labels."""
    requests = sum(s.value for m in gw.metrics.requests.collect() for s in m.samples if s.name.endswith("_total"))
    refusals = sum(s.value for m in gw.metrics.rejects.collect() for s in m.samples if s.name.endswith("_total"))
    bounds = [*LATENCY_BUCKETS, float("inf")]
    buckets = [0.0] * len(bounds)
    for m in gw.metrics.latency.collect():
        for s in m.samples:
            if s.name.endswith("_bucket"):
                buckets[bounds.index(float(s.labels["le"]))] += s.value
    return Sample(time.time(), requests, refusals, tuple(buckets))


class RefusalLog(logging.Handler):
    """The last refusals from the access log: when, which request, why, what the client got."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_REFUSALS)

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields.get("refusal") is not None:
            self.recent.appendleft({"at": record.created, "request_id": fields.get("request_id"),
                                    "reason": str(fields["refusal"]), "status": fields.get("status"),
                                    "endpoint": fields.get("endpoint"), "model": fields.get("model")})


class Dashboard:
    """The page's routes and the sampler behind its charts, for one gateway."""

    def __init__(self, gw: Gateway, interval_s: float = INTERVAL_S, window_s: float = WINDOW_S) -> None:
        self.gw, self.interval_s, self.window_s = gw, interval_s, window_s
        self.samples: deque[Sample] = deque(maxlen=int(window_s / interval_s) + 1)
        self.refusals = RefusalLog()

    def routes(self, guarded: Callable[[Handler], Handler]) -> list[tuple[str, str, Handler]]:
        """``/dashboard`` and its static files (no data, no token), ``/dashboard/state`` (guarded)."""
        files = resources.files("cacheon.gateway") / "static"
        pages = {name: (files / name).read_bytes() for name in STATIC}

        def static(name: str) -> Handler:
            async def handler(_: web.Request) -> web.StreamResponse:
                return web.Response(body=pages[name], content_type=STATIC[name], charset="utf-8",
                                    headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                                             "Content-Security-Policy": "default-src 'self'; "
                                             "frame-ancestors 'none'"})

            return handler

        async def state(_: web.Request) -> web.StreamResponse:
            body = _json.encode(await self.state())
            return web.Response(body=body, content_type="application/json", headers={"Cache-Control": "no-store"})

        return [("GET", "/dashboard", static("dashboard.html")),
                *(("GET", f"/dashboard/{name}", static(name)) for name in STATIC if name != "dashboard.html"),
                ("GET", "/dashboard/state", guarded(state))]

    async def sampling(self, _: web.Application) -> AsyncIterator[None]:
        """An aiohttp cleanup context: sample while the admin listener runs, and read the access log."""
        access = logging.getLogger("cacheon.access")
        access.addHandler(self.refusals)
        task = asyncio.create_task(self._sample_every())
        try:
            yield
        finally:
            task.cancel()
            access.removeHandler(self.refusals)

    async def _sample_every(self) -> None:
        while True:
            self.samples.append(sample(self.gw))
            await asyncio.sleep(self.interval_s)

    async def state(self) -> dict[str, Any]:
        """What the page shows: ``/status`` (read on the event loop, digests off it) and the samples."""
        status = await self.gw.status()
        for worker in status["workers"]:
            held = self.gw.fleet.workers.get(worker["id"])
            worker["page_size"] = held.discovery.page_size if held is not None and held.discovery else None
        now = sample(self.gw)
        history = [*self.samples, now]
        rate = [{"at": b.at, "requests_per_s": (b.requests - a.requests) / (b.at - a.at),
                 "refusals_per_s": (b.refusals - a.refusals) / (b.at - a.at)}
                for a, b in pairwise(history) if b.at > a.at]
        first = history[0]
        counts = _per_bucket([n - f for n, f in zip(now.buckets, first.buckets, strict=True)])
        return {"now": now.at, "policy": status["policy"], "workers": status["workers"],
                "interval_s": self.interval_s, "window_s": self.window_s, "since": first.at, "rate": rate,
                "latency": [{"le": le, "count": n} for le, n in zip([*LATENCY_BUCKETS, None], counts, strict=True)],
                "refusals": list(self.refusals.recent)}


def _per_bucket(cumulative: list[float]) -> list[float]:
    """Prometheus buckets are cumulative (``le``); a histogram's bars are not."""
    return [n - (cumulative[i - 1] if i else 0.0) for i, n in enumerate(cumulative)]
