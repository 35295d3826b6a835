"""One gateway: the parts a config builds (profiles, index, chain cache, policy, metrics, tracing) and
the two that work on them, the fleet (workers) and the proxy (requests), started and stopped together."""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from cacheon.errors import UsageError
from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.fleet import Fleet
from cacheon.gateway.http import session
from cacheon.gateway.metrics import Metrics, WorkerView
from cacheon.gateway.policy import make_policy
from cacheon.gateway.proxy import Proxy
from cacheon.gateway.tracing import Tracing
from cacheon.gateway.workers import WorkerState
from cacheon.kv.feed import FeedCounters, Source
from cacheon.kv.index import BlockIndex
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile


def load_profiles(cfg: GatewayConfig) -> dict[str, TokenizerProfile]:
    """Every configured tokenization profile; an unreadable one is an error naming its config key."""
    profiles = {}
    for name, spec in cfg.models.items():
        try:
            profiles[name] = TokenizerProfile(spec)
        except UsageError as exc:
            raise UsageError(f"models.{name}: {exc}") from None
    return profiles


class Gateway:
    """Owns every cache and index it routes with: nothing is shared through module state."""

    def __init__(self, cfg: GatewayConfig, tracing: Tracing | None = None) -> None:
        self.cfg = cfg
        self.profiles = load_profiles(cfg)
        self.index: BlockIndex[Source] = BlockIndex()
        self.chains = ChainCache()
        self.policy = make_policy(cfg, self.index, self.chains)
        self.fleet = Fleet(cfg, self.profiles, self.index, self.chains, self.policy)
        self.metrics = Metrics(self.worker_views, self.profiles, self.chains)
        if tracing is None and cfg.tracing.enabled:
            tracing = Tracing(cfg.tracing)
        self.tracing = tracing
        self.proxy = Proxy(cfg, self.fleet, self.policy, self.profiles, self.metrics, tracing)
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._client = session()
        await self.fleet.start(self._client)

    async def stop(self) -> None:
        await self.fleet.stop()
        self.proxy.close()
        if self._client is not None:
            await self._client.close()
        if self.tracing is not None:
            self.tracing.close()

    def worker_views(self) -> list[WorkerView]:
        """Every worker as a metrics scrape reads it (digests included: run off the event loop)."""
        now = time.time()
        views = []
        for w in list(self.fleet.workers.values()):
            lag = w.feeds.lag_s() if w.feeds is not None else None
            views.append(WorkerView(w.id, w.state, w.in_flight, w.healthy and w.breaker.closed(now), w.draining,
                                    self.fleet.indexed_blocks(w), self.fleet.digest(w),
                                    w.feeds.totals() if w.feeds is not None else FeedCounters(), lag,
                                    w.precision))
        return views

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready: some worker can take a request now and, under an attesting policy, is READY with
        its KV subscriptions live. The detail says what is missing."""
        now = time.time()
        workers = list(self.fleet.workers.values())
        available = [w for w in workers if w.available(now)]
        if self.policy.attests:
            usable = [w for w in available if w.state == WorkerState.READY and w.feeds is not None and w.feeds.alive()]
            what = "READY workers with live KV subscriptions"
        else:
            usable, what = available, "available workers"
        ready = bool(usable)
        detail: dict[str, Any] = {"ready": ready, "policy": self.cfg.policy, "workers": len(workers),
                                  "available": len(available), "usable": len(usable)}
        if not ready:
            detail["reason"] = f"no {what} ({len(workers)} registered)"
        return ready, detail

    def status(self) -> dict[str, Any]:
        """``/status``: the policy and every worker (digests included: run off the event loop)."""
        workers = list(self.fleet.workers.values())
        return {"policy": self.cfg.policy, "workers": [self.fleet.status(w, self.fleet.digest(w)) for w in workers]}
