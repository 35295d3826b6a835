"""One gateway: the parts a config builds (profiles, index, chain cache, policy, metrics, tracing) and
the two that work on them, the fleet (workers) and the proxy (requests), started and stopped together."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import aiohttp

from cacheon.errors import UsageError
from cacheon.gateway.config import RELOADABLE, GatewayConfig, changed_keys
from cacheon.gateway.fleet import Fleet
from cacheon.gateway.http import session
from cacheon.gateway.metrics import Metrics, WorkerView
from cacheon.gateway.policy import Exact, InFlight, Policy, make_policy
from cacheon.gateway.proxy import Proxy
from cacheon.gateway.tracing import Tracing
from cacheon.gateway.workers import WorkerState
from cacheon.kv.feed import FeedCounters, Source
from cacheon.kv.index import BlockIndex
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile

if TYPE_CHECKING:
    from cacheon.fleet.load import LoadShare


def load_profiles(cfg: GatewayConfig) -> dict[str, TokenizerProfile]:
    """Every configured tokenization profile; an unreadable one is an error naming its config key."""
    profiles = {}
    for name, spec in cfg.models.items():
        try:
            profiles[name] = TokenizerProfile(spec)
        except UsageError as exc:
            raise UsageError(f"models.{name}: {exc}") from None
    return profiles


def fleet_load(cfg: GatewayConfig, policy: Policy, metrics: Metrics) -> LoadShare[InFlight] | None:
    """This replica's share of the fleet's in-flight load (``event_plane.share_load``, the ``exact``
    policy), hooked into the policy; None when off (``cacheon.fleet`` needs the ``fleet`` extra)."""
    plane = cfg.event_plane
    if plane is None or not plane.share_load or not isinstance(policy, Exact):
        return None
    try:
        from cacheon.fleet.load import LoadShare, Routed
    except ModuleNotFoundError as exc:
        raise UsageError(f"event_plane.share_load needs the fleet extra ({exc.name} is not installed): "
                         "pip install 'cacheon[fleet]'") from None

    def remote(event: Routed, routed: float) -> InFlight:
        return InFlight(event.worker, event.chain, event.page, event.uncached, event.work, routed, False)

    share = LoadShare(plane.url, plane.stream, plane.load_heartbeat_s, plane.load_expiry_s,
                                 metrics.registry, remote)
    policy.fleet_load = share
    return share


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
        self.load = fleet_load(cfg, self.policy, self.metrics)
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._client = session()
        await self.fleet.start(self._client)
        if self.load is not None:
            await self.load.start()

    async def stop(self) -> None:
        if self.load is not None:
            await self.load.stop()
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
                                    w.precision, w.feeds is not None and w.feeds.stale(now)))
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
        if self.load is not None:
            detail["fleet_load"] = self.load.status()
        if self.fleet.plane is not None:
            detail["event_plane"] = self.fleet.plane.status(now)
        return ready, detail

    def model_names(self) -> list[str]:
        """The configured models, else those the workers were found serving."""
        return list(self.profiles) or sorted({w.discovery.model for w in self.fleet.workers.values() if w.discovery})

    def summary(self) -> dict[str, Any]:
        """The traffic port's ``/status``: readiness, models and how many workers are in each ladder state;
        no worker URLs, reasons or request ids (those are the admin listener's ``/status``)."""
        _, detail = self.readiness()
        states = Counter(w.state.value for w in self.fleet.workers.values())
        return {**detail, "models": self.model_names(), "states": dict(sorted(states.items()))}

    async def reload(self, cfg: GatewayConfig) -> dict[str, Any]:
        """Apply ``cfg`` (already validated) if it changes only what a running gateway can change; UsageError
        naming the first problem otherwise, with the running config kept whole. Says what changed."""
        changed = changed_keys(self.cfg, cfg)
        fixed = [key for key in changed if key not in RELOADABLE]
        if fixed:
            raise UsageError(f"{', '.join(fixed)}: fixed at start, restart the gateway to change "
                             f"{'it' if len(fixed) == 1 else 'them'}; nothing was applied")
        gone, new = await self.fleet.reconcile(self.cfg.workers, cfg.workers)
        self.cfg = self.fleet.cfg = cfg
        added = await self.fleet.apply(gone, new)
        return {"changed": changed, "workers_added": [w.id for w in added], "workers_removed": [w.id for w in gone]}

    async def status(self) -> dict[str, Any]:
        """``/status``: the policy and every worker. Their fields are read here, on the event loop that
        owns them; only the digests (O(blocks), over the index the feed threads share) run off it."""
        workers = list(self.fleet.workers.values())
        digests = await asyncio.to_thread(lambda: [self.fleet.digest(w) for w in workers])
        return {"policy": self.cfg.policy,
                "workers": [self.fleet.status(w, d) for w, d in zip(workers, digests, strict=True)]}
