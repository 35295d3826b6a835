"""The workers behind a gateway: register, attest, feed, check health, drain, remove.

Everything here runs on the gateway's event loop; each worker's KV feeds run in a thread of
their own (``WorkerFeeds``) and touch only the shared index and ``Echoes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import socket
import sys
import time
from array import array
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp

from cacheon.errors import UsageError
from cacheon.gateway.attest import Echoes, Rung, climb
from cacheon.gateway.breaker import Breaker
from cacheon.gateway.config import GatewayConfig, WorkersDns, WorkerSpec
from cacheon.gateway.feeds import WorkerFeeds
from cacheon.gateway.http import TRANSPORT_ERRORS
from cacheon.gateway.policy import Policy
from cacheon.gateway.workers import Endpoint, FenceReason, Worker, WorkerState, discover, endpoints, is_self
from cacheon.kv.contracts import by_id
from cacheon.kv.feed import Source
from cacheon.kv.index import PrefixIndex
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile

if TYPE_CHECKING:  # the event plane's client (the fleet extra) is imported only when a config names one
    from cacheon.fleet.consumer import PlaneConsumer

log = logging.getLogger("cacheon.gateway")
Admitted = tuple[WorkerSpec, frozenset[Endpoint]]  # a worker entry checked for adding, with what its URL reached


class Fleet:
    """The worker set and each worker's lifecycle."""

    def __init__(self, cfg: GatewayConfig, profiles: dict[str, TokenizerProfile], index: PrefixIndex[Source],
                 chains: ChainCache, policy: Policy) -> None:
        self.cfg, self.profiles, self.index, self.chains, self.policy = cfg, profiles, index, chains, policy
        self.echoes = Echoes()
        self.workers: dict[str, Worker] = {}
        self.own: list[Endpoint] = []  # the gateway's own bound listeners: never a worker
        self._client: aiohttp.ClientSession | None = None
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._attesting: set[str] = set()
        self._digests: dict[str, tuple[tuple[int, ...], str]] = {}  # worker id -> (what it was computed at, digest)
        self.plane: PlaneConsumer | None = None  # KV feeds from the event plane instead of the workers' ZMQ

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, client: aiohttp.ClientSession) -> None:
        self._client = client
        ep = self.cfg.event_plane
        if ep is not None and ep.kv_events == "relay":
            try:
                from cacheon.fleet.consumer import PlaneConsumer
            except ModuleNotFoundError as exc:
                raise UsageError(f"event_plane needs {exc.name}: pip install 'cacheon[fleet]'") from None
            self.plane = PlaneConsumer(ep.url, ep.stream, ep.snapshot_bucket, ep.staleness_s)
        for i, spec in enumerate(self.cfg.workers):
            try:
                await self.add(spec)
            except UsageError as exc:
                raise UsageError(f"workers[{i}]: {exc}") from None
        for dns in self.cfg.workers_dns:
            self._spawn(self._dns_loop(dns))
        self._spawn(self._health_loop())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self.workers.values():
            self._unsubscribe(w)
        if self.plane is not None:
            await asyncio.to_thread(self.plane.close)

    @property
    def client(self) -> aiohttp.ClientSession:
        if self._client is None:
            raise RuntimeError("the fleet is not started")
        return self._client

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def add(self, spec: WorkerSpec, origin: str = "config") -> Worker:
        """Register and attest a worker; UsageError for the gateway itself or an engine already registered
        (under this URL or another that resolves to the same address and port)."""
        found = await endpoints(spec.url)
        refused = self._refusal(spec, found, list(self.workers.values()))
        if refused is not None:
            raise UsageError(refused)
        return self._register(spec, found, origin)

    def _refusal(self, spec: WorkerSpec, found: frozenset[Endpoint], others: list[Worker]) -> str | None:
        if is_self(found, self.own):
            return f"{spec.url} is this gateway's own listener: requests would loop through it"
        same = next((w for w in others if w.url == spec.url or (spec.id is not None and w.id == spec.id)), None)
        if same is not None:
            return f"worker {same.id} ({same.url}) is already registered"
        same = next((w for w in others if w.endpoints & found), None)
        if same is not None:
            address, port = sorted(same.endpoints & found)[0]
            return (f"{spec.url} is worker {same.id or '(new)'} ({same.url}) under another name: both reach "
                    f"{f'[{address}]' if ':' in address else address}:{port}")
        return None

    def _register(self, spec: WorkerSpec, found: frozenset[Endpoint], origin: str) -> Worker:
        wid = spec.id or f"w{next(self._ids)}"
        while wid in self.workers:
            wid = f"w{next(self._ids)}"
        breaker = Breaker(self.cfg.breaker_failures, self.cfg.breaker_open_s)
        worker = self.workers[wid] = Worker(wid, spec, endpoints=found, origin=origin, breaker=breaker)
        log.info(f"worker {wid} added", extra={"fields": {"worker": wid, "url": spec.url, "origin": origin}})
        self._spawn(self.attest(worker))
        return worker

    async def reconcile(self, old: list[WorkerSpec], new: list[WorkerSpec]) -> tuple[list[Worker], list[Admitted]]:
        """What the config's worker list going from ``old`` to ``new`` takes: the workers to remove (configured
        entries that left it) and the entries to add, each checked as ``add`` checks it (UsageError naming
        its entry). Workers added by the admin API or DNS stay; nothing changes here."""
        gone = [w for w in self.workers.values() if w.origin == "config" and w.spec in old and w.spec not in new]
        others = [w for w in self.workers.values() if w not in gone]
        added = []
        for i, spec in enumerate(new):
            if spec in old:
                continue
            found = await endpoints(spec.url)
            refused = self._refusal(spec, found, others)
            if refused is not None:
                raise UsageError(f"workers[{i}]: {refused}")
            others.append(Worker(spec.id or "", spec, endpoints=found))
            added.append((spec, found))
        return gone, added

    async def apply(self, gone: list[Worker], new: list[Admitted]) -> list[Worker]:
        """``reconcile``'s plan. The gone workers drain (no new requests from now on) and are removed in the
        background, except one whose id a new entry takes: that one is removed first."""
        reused = {spec.id for spec, _ in new}
        for worker in gone:
            worker.draining = True
            if worker.id in reused:
                await self.remove(worker)
            else:
                self._spawn(self.remove(worker))
        return [self._register(spec, found, "config") for spec, found in new]

    async def drain(self, worker: Worker, deadline_s: float | None = None) -> bool:
        """No new requests from now on; wait up to ``deadline_s`` for those in flight. Whether none are left."""
        worker.draining = True
        deadline = time.monotonic() + (self.cfg.drain_timeout_s if deadline_s is None else deadline_s)
        while worker.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return worker.in_flight == 0

    async def remove(self, worker: Worker, deadline_s: float | None = None) -> None:
        """Drain first (up to the deadline), then drop its KV state and what the policy keeps about it."""
        await self.drain(worker, deadline_s)
        self.workers.pop(worker.id, None)
        self._unsubscribe(worker)
        self.policy.forget(worker.id)
        self._digests.pop(worker.id, None)
        log.info(f"worker {worker.id} removed", extra={"fields": {"worker": worker.id, "url": worker.url,
                                                                  "in_flight_left": worker.in_flight}})

    async def _dns_loop(self, dns: WorkersDns) -> None:
        """Keep one worker per address ``dns.name`` resolves to (a headless Service's pods)."""
        origin = f"dns:{dns.name}"
        while True:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(dns.name, dns.port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning(f"cannot resolve {dns.name}: {exc}; keeping its workers as they are",
                            extra={"fields": {"dns": dns.name}})
            else:
                hosts = {str(info[4][0]) for info in infos}
                urls = {f"{dns.scheme}://{f'[{h}]' if ':' in h else h}:{dns.port}" for h in hosts}
                known = {w.url: w for w in self.workers.values() if w.origin == origin}
                for url in sorted(urls - set(known)):
                    with contextlib.suppress(UsageError):  # the same engine configured statically
                        await self.add(WorkerSpec(url=url), origin)
                for url in sorted(set(known) - urls):
                    self._spawn(self.remove(known[url]))
            await asyncio.sleep(dns.interval_s)

    # -- attestation and feeds -----------------------------------------------------------

    async def attest(self, worker: Worker) -> None:
        """Attesting policies: the full ladder. Others: discovery only, for /status and approx."""
        if worker.id in self._attesting:
            return
        self._attesting.add(worker.id)
        try:
            if self.policy.attests:
                ladder = climb(self.client, worker, self.cfg, self.profiles, self.echoes, self.chains.chain)
                async with contextlib.aclosing(ladder):
                    async for rung in ladder:
                        if not self._apply(worker, rung):
                            break
                worker.seen_resets, worker.seen_rejects = worker.resets(), worker.rejects()
            else:
                with contextlib.suppress(Exception):
                    worker.discovery = await discover(self.client, worker.url, self.cfg.request_timeout_s)
                    self._twin_fenced(worker)
        finally:
            self._attesting.discard(worker.id)

    def _apply(self, worker: Worker, rung: Rung) -> bool:
        """One rung of the ladder: identity first (and the feeds it names), then the state. False: the
        worker is another's engine under a second URL, fenced, and the ladder stops."""
        if rung.discovery is not None:
            worker.contract_id, worker.discovery = rung.contract_id, rung.discovery
            if self._twin_fenced(worker):
                self._unsubscribe(worker)
                return False
            self._subscribe(worker)
        worker.set_state(rung.state, rung.reason, rung.detail)
        return True

    def _twin_fenced(self, worker: Worker) -> bool:
        """Fence ``worker`` if another registered worker's discovered KV publisher is its own (two URLs, one
        engine: a port forward, a second Service); whether it was."""
        mine = worker.kv_endpoints()
        twin = next((w for w in self.workers.values() if w is not worker and not w.draining
                     and w.reason != FenceReason.DUPLICATE_ENGINE and w.kv_endpoints() & mine), None)
        if twin is None:
            return False
        address, port = sorted(twin.kv_endpoints() & mine)[0]
        worker.set_state(WorkerState.FENCED, FenceReason.DUPLICATE_ENGINE,
                         f"its KV publisher {f'[{address}]' if ':' in address else address}:{port} is worker "
                         f"{twin.id}'s ({twin.url}): the same engine")
        return True

    def _subscribe(self, worker: Worker) -> None:
        """(Re)connect the worker's KV feeds for its discovered geometry."""
        found, contract = worker.discovery, by_id(worker.contract_id or "")
        assert found is not None and found.kv_port is not None  # checked by the ladder's identity rung
        if worker.feeds is not None:
            if worker.feeds.serves(contract, found.dp_size):
                return
            self._unsubscribe(worker)
        echo = functools.partial(self.echoes.on_delivery, worker.id)
        if self.plane is not None:
            worker.feeds = self.plane.follow(worker.plane_name, worker.id, contract, found.dp_size, self.index, echo,
                                             self.cfg.kv_wire)
            return
        replay = worker.replay_port
        worker.feeds = WorkerFeeds(
            worker.id, f"tcp://{worker.kv_host}:{found.kv_port}", contract, found.dp_size,
            f"tcp://{worker.kv_host}:{replay}" if replay else None, self.index,
            echo, self.cfg.kv_wire, self.cfg.kv_max_replay,
        )

    def _unsubscribe(self, worker: Worker) -> None:
        if worker.feeds is not None:
            worker.feeds.close()
            worker.feeds = None

    # -- health --------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            for w in list(self.workers.values()):
                await self._check(w)

    async def _check(self, w: Worker) -> None:
        """Health check; restarts, reconnects, rejects and the cadence trigger re-attestation.

        A healthy worker that answered a request within the interval passed it already: the probe is
        skipped. On SGLang ``/health`` generates a token, so a probe of a busy worker costs its engine
        a prefill and the gateway an HTTP call for nothing the answers have not said."""
        if w.healthy and time.monotonic() - w.breaker.answered_at < self.cfg.health_interval_s:
            ok = True
        else:
            try:
                async with self.client.get(f"{w.url}/health", timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                    ok = resp.status == 200
            except TRANSPORT_ERRORS:
                ok = False
        came_back = ok and not w.healthy
        w.healthy = ok
        if ok and came_back:
            w.breaker.reset()
        if not self.policy.attests or not ok:
            return
        resets, rejects = w.resets(), w.rejects()
        if rejects > w.seen_rejects:
            w.set_state(WorkerState.FENCED, FenceReason.CONTRACT_REJECT,
                        f"{rejects - w.seen_rejects} KV batch(es) refused by the decoder")
        now = time.time()
        stale = w.state == WorkerState.READY and now - (w.attested_at or now) > self.cfg.attest_interval_s
        retry = w.state == WorkerState.FENCED and now - w.state_since > self.cfg.attest_retry_s
        if came_back or resets > w.seen_resets or rejects > w.seen_rejects or stale or retry:
            if w.state == WorkerState.READY:
                w.set_state(WorkerState.FENCED, FenceReason.REATTEST, "re-attesting")
            self._spawn(self.attest(w))

    # -- views ---------------------------------------------------------------------------

    def pool(self, model: str | None, tried: set[str]) -> list[Worker]:
        """Workers that may take a request now: available, untried, serving its model (if known)."""
        now = time.time()
        return [w for w in self.workers.values()
                if w.available(now) and w.id not in tried
                and (model is None or w.discovery is None or w.discovery.model == model)]

    def indexed_blocks(self, w: Worker) -> int:
        d = w.discovery
        return sum(self.index.blocks((w.id, r)) for r in range(d.dp_size if d else 0))

    def digest(self, w: Worker) -> str | None:
        """A digest of the blocks indexed for ``w`` (every rank): equal on replicas that saw the same events.

        SHA-256 over each rank's sorted ids; O(its blocks), so it is recomputed only after the
        worker's feeds applied or cleared something, and callers run it off the event loop.
        """
        feeds, d = w.feeds, w.discovery
        if feeds is None or d is None:
            return None
        totals = feeds.totals()
        at = (id(feeds), totals.batches, totals.clears, self.indexed_blocks(w))
        cached = self._digests.get(w.id)
        if cached is not None and cached[0] == at:
            return cached[1]
        h = hashlib.sha256()
        for rank in range(d.dp_size):
            ids = array("q", sorted(self.index.held((w.id, rank))))
            if sys.byteorder == "little":
                ids.byteswap()  # big-endian: the same bytes on every machine
            h.update(rank.to_bytes(4, "big") + len(ids).to_bytes(8, "big") + ids.tobytes())
        digest = h.hexdigest()[:16]
        self._digests[w.id] = (at, digest)
        return digest

    def status(self, w: Worker, digest: str | None = None) -> dict[str, Any]:
        d = w.discovery
        return {
            "id": w.id,
            "url": w.url,
            "version": d.version if d else None,
            "model": d.model if d else None,
            "contract": w.contract_id,
            "ladder": {"state": w.state, "reason": w.reason, "detail": w.detail, "since": w.state_since,
                       "attested_at": w.attested_at},
            "healthy": w.healthy,
            "draining": w.draining,
            "breaker_open": not w.breaker.closed(time.time()),
            "in_flight": w.in_flight,
            "kv_replay_port": w.replay_port,
            "indexed_blocks": self.indexed_blocks(w),
            "index_digest": digest,
            "subscribed": w.feeds is not None and w.feeds.alive(),
            "origin": w.origin,
            "last_seq": w.last_seq(),
            "rejects": w.feed_totals().as_dict()["rejects"],
            "precision": w.precision.as_dict(),
        }
