"""The gateway's view of one worker: what was discovered, what is proven, what is in flight."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp

from cacheon.gateway.breaker import Breaker
from cacheon.gateway.config import WorkerSpec
from cacheon.gateway.feeds import WorkerFeeds
from cacheon.gateway.http import CallError, call_json, get_json
from cacheon.gateway.precision import Precision
from cacheon.kv.feed import FeedCounters

if TYPE_CHECKING:  # the event plane's client (the fleet extra) is imported only when a config names one
    from cacheon.fleet.consumer import PlaneFeed

log = logging.getLogger("cacheon.gateway")


class WorkerState(StrEnum):
    """The exact-attestation ladder, in order, and its failure; exact routing only at READY."""

    PENDING = "PENDING"
    PROFILE_VALIDATED = "PROFILE_VALIDATED"
    TOKEN_PARITY_VERIFIED = "TOKEN_PARITY_VERIFIED"
    ENGINE_HASH_ATTESTED = "ENGINE_HASH_ATTESTED"
    READY = "READY"
    FENCED = "FENCED"


class FenceReason(StrEnum):
    """Why a worker is FENCED (README, *Attestation ladder*)."""

    UNREACHABLE = "unreachable"
    IDENTITY_MISMATCH = "identity_mismatch"
    ENGINE_GEOMETRY_MISMATCH = "engine_geometry_mismatch"
    PROBE_SCHEMA_MISMATCH = "probe_schema_mismatch"
    TOKEN_MISMATCH = "token_mismatch"
    CHALLENGE_TIMEOUT = "challenge_timeout"
    CHALLENGE_FAILED = "challenge_failed"
    CONTRACT_REJECT = "contract_reject"
    HASH_SCHEME_UNSUPPORTED = "hash_scheme_unsupported"  # e.g. EAGLE's bigram keys: no contract declares them
    REATTEST = "reattest"  # a READY worker while its ladder runs again
    DUPLICATE_ENGINE = "duplicate_engine"  # its KV publisher is another registered worker's: the same engine


@dataclass(frozen=True)
class Discovery:
    """What the worker says about itself (``/server_info`` and ``/model_info``)."""

    version: str
    model: str
    page_size: int
    dp_size: int
    kv_port: int | None  # None: the worker publishes no KV events
    replay_port: int | None = None  # rank 0's replay ROUTER port, from the server args; None: no replay
    max_running: int | None = None  # sequences one DP rank runs at once, as the scheduler reports it
    cache_report: bool = True  # --enable-cache-report: OpenAI usage carries cached_tokens (absent: assumed on)
    speculative: str | None = None  # --speculative-algorithm (EAGLE variants key pages by token bigrams)
    max_model_len: int | None = None  # the context length in tokens (``/v1/models``); None: not reported

    def __post_init__(self) -> None:
        """What a worker says is checked here, once: each rank r listens on ``base + r`` (a last port past
        65535 made every subscription of the worker fail, leaking its sockets each time)."""
        if self.page_size < 1 or self.dp_size < 1:
            raise ValueError(f"page size {self.page_size} and DP size {self.dp_size} must be at least 1")
        for name, base in (("KV event port base", self.kv_port), ("KV replay port base", self.replay_port)):
            if base is not None and not 1 <= base <= base + self.dp_size - 1 <= 65535:
                raise ValueError(f"{name} {base} with {self.dp_size} DP rank(s) does not fit TCP ports 1-65535")


Endpoint = tuple[str, int]  # an IP address and a TCP port


async def endpoints(url: str, timeout_s: float = 5.0) -> frozenset[Endpoint]:
    """Every (address, port) ``url``'s host resolves to: one engine's identity on the network, whatever
    alias names it. Empty when the name does not resolve (yet): nothing to compare then."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(
            parts.hostname, port, type=socket.SOCK_STREAM), timeout_s)
    except OSError:  # TimeoutError included
        return frozenset()
    return frozenset((_unmapped(str(info[4][0])), port) for info in infos)


def _unmapped(address: str) -> str:
    """``address`` without an IPv6 zone, and an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) as the
    IPv4 one it reaches."""
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


def _local(address: str) -> bool:
    """Whether ``address`` is one of this machine's (it can be bound here)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def is_self(found: frozenset[Endpoint], own: list[Endpoint]) -> bool:
    """Whether an endpoint of ``found`` is one the gateway itself listens on (``own``: its bound listeners;
    an unspecified host, ``0.0.0.0`` or ``::``, listens on every local address)."""
    for address, port in found:
        ip = ipaddress.ip_address(address)
        for host, own_port in own:
            if port != own_port:
                continue
            if host in ("0.0.0.0", "::"):  # every local address ("::" takes IPv4 too, dual-stack)
                if (ip.version == 4 or host == "::") and (ip.is_unspecified or _local(address)):
                    return True
            elif address == host or ip.is_unspecified or (host == "localhost" and ip.is_loopback):
                return True
    return False


class DiscoveryError(Exception):
    """The worker's self-description is missing or malformed."""


async def discover(client: aiohttp.ClientSession, url: str, timeout_s: float) -> Discovery:
    """Ask the worker; the KV port base is dialled on the worker URL's host (README, *Discovery*).

    ``/server_info`` and ``/model_info`` first; the deprecated ``/get_*`` aliases where a release
    answers only those.
    """
    try:
        info = await get_json(client, f"{url}/server_info", timeout_s, fallbacks=(f"{url}/get_server_info",))
        model = await get_json(client, f"{url}/model_info", timeout_s, fallbacks=(f"{url}/get_model_info",))
        kv = info.get("kv_events")
        served = str(info.get("served_model_name") or model["model_path"])
        return Discovery(
            version=str(info["version"]),
            model=served,
            page_size=int(kv["block_size"] if kv else info.get("page_size") or 1),
            dp_size=int(kv["dp_size"] if kv else info.get("dp_size") or 1),
            kv_port=int(kv["endpoint_port_base"]) if kv else None,
            replay_port=_replay_port(info.get("kv_events_config")) if kv else None,
            max_running=_max_running(info),
            cache_report=info.get("enable_cache_report") is not False,
            speculative=str(info["speculative_algorithm"]) if info.get("speculative_algorithm") else None,
            max_model_len=await _max_model_len(client, url, served, timeout_s),
        )
    except (CallError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DiscoveryError(f"{url}: cannot discover the worker: {exc}") from None


async def _max_model_len(client: aiohttp.ClientSession, url: str, model: str, timeout_s: float) -> int | None:
    """The served model's ``max_model_len`` in ``/v1/models`` (SGLang's context length); None where it is
    not said: the bound on prompts is optional, discovery does not fail on it."""
    try:
        status, got = await call_json(client, "GET", f"{url}/v1/models", timeout_s)
    except CallError:
        return None
    cards = got.get("data") if status == 200 and isinstance(got, dict) else None
    for card in cards if isinstance(cards, list) else ():
        if isinstance(card, dict) and card.get("id") == model:
            value = card.get("max_model_len")
            return value if type(value) is int and value > 0 else None
    return None


def _max_running(info: dict[str, Any]) -> int | None:
    """The scheduler's bound on running requests per DP rank (``internal_states``, 0.5.13.post1 on), else the
    ``max_running_requests`` server argument; None when neither says (a router then assumes no bound)."""
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    for value in (state.get("effective_max_running_requests_per_dp"), info.get("max_running_requests")):
        if type(value) is int and value > 0:
            return value
    return None


def _replay_port(config: Any) -> int | None:
    """The port of ``replay_endpoint`` in the worker's ``--kv-events-config`` (a JSON string in its server args).

    SGLang offsets it by the DP rank as it does the publish endpoint. Replay is optional: an
    absent, non-TCP or malformed setting means none (a hole then clears the rank instead).
    """
    try:
        endpoint = (json.loads(config) if isinstance(config, str) else config or {}).get("replay_endpoint")
        if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
            return None
        port = int(endpoint.rsplit(":", 1)[1])
    except (ValueError, AttributeError, IndexError):
        return None
    return port if 0 < port < 65536 else None


@dataclass
class Worker:
    """Mutable per-worker state; changed on the event loop, never by the KV thread."""

    id: str
    spec: WorkerSpec
    discovery: Discovery | None = None
    contract_id: str | None = None
    state: WorkerState = WorkerState.PENDING
    reason: FenceReason | None = None
    detail: str | None = None
    state_since: float = field(default_factory=time.time)
    attested_at: float | None = None
    healthy: bool = True
    draining: bool = False
    in_flight: int = 0
    breaker: Breaker = field(default_factory=Breaker)
    feeds: WorkerFeeds | PlaneFeed | None = None
    seen_resets: int = 0
    seen_rejects: int = 0
    endpoints: frozenset[Endpoint] = frozenset()  # what its URL resolved to when it was added
    origin: str = "config"  # config, admin, or dns:NAME (workers a DNS name stops returning are removed)
    precision: Precision = field(default_factory=Precision)

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def kv_host(self) -> str:
        return urlsplit(self.spec.url).hostname or "127.0.0.1"

    def set_state(self, state: WorkerState, reason: FenceReason | None = None, detail: str | None = None) -> None:
        """Move along the ladder; every change is logged with its reason (FENCED at WARNING)."""
        if (state, reason, detail) != (self.state, self.reason, self.detail):
            level = logging.WARNING if state == WorkerState.FENCED else logging.INFO
            log.log(level, f"worker {self.id} {self.state} -> {state}", extra={"fields": {
                "worker": self.id, "url": self.url, "from": self.state, "to": state, "reason": reason,
                "detail": detail}})
        self.state, self.reason, self.detail, self.state_since = state, reason, detail, time.time()
        if state == WorkerState.READY:
            self.attested_at = self.state_since

    def kv_endpoints(self) -> frozenset[Endpoint]:
        """Where its discovered KV publisher listens: the same engine whatever URL reaches its HTTP port."""
        port = self.discovery.kv_port if self.discovery else None
        return frozenset() if port is None else frozenset((address, port) for address, _ in self.endpoints)

    def available(self, now: float) -> bool:
        """May take a new request: healthy, not draining, breaker closed, its KV state not stale (event plane)."""
        return (self.healthy and not self.draining and self.breaker.closed(now)
                and not (self.feeds is not None and self.feeds.stale(now)))

    @property
    def plane_name(self) -> str:
        """Its name on the event plane, as the relays name it: the configured id, else the URL."""
        return self.spec.id or self.spec.url

    def feed_totals(self) -> FeedCounters:
        return self.feeds.totals() if self.feeds else FeedCounters()

    def resets(self) -> int:
        """Restarts, reconnects and clears its KV feeds counted: each one can mean a changed cache."""
        totals = self.feed_totals()
        return totals.restarts + totals.reconnects + totals.clears

    def rejects(self) -> int:
        """KV batches the decoder refused, all reasons together."""
        return sum(self.feed_totals().rejects.values())

    @property
    def replay_port(self) -> int | None:
        """Rank 0's replay port: discovered from the worker's server args, else as configured."""
        found = self.discovery.replay_port if self.discovery else None
        return found or self.spec.kv_replay_port

    def last_seq(self) -> dict[int, int | None]:
        return self.feeds.last_seq() if self.feeds else {}
