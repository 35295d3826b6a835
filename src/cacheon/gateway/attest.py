"""The exact-attestation ladder: prove a worker tokenizes and hashes as predicted before routing on it.

PROFILE_VALIDATED (identity, geometry) -> TOKEN_PARITY_VERIFIED (probe texts tokenize identically)
-> ENGINE_HASH_ATTESTED (a nonce prompt's pages come back as exactly the predicted BlockStored
events, on one rank) -> READY. A failure fences the worker off exact routing with a reason.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import Any

import httpx

from cacheon.errors import UsageError
from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.contracts import for_version
from cacheon.gateway.hashing import page_hashes
from cacheon.gateway.subscriber import Delivery
from cacheon.gateway.tokenize import Profile
from cacheon.gateway.workers import (
    ENGINE_HASH_ATTESTED,
    FENCED,
    PROFILE_VALIDATED,
    READY,
    TOKEN_PARITY_VERIFIED,
    Discovery,
    DiscoveryError,
    Worker,
    discover,
)

REASONS = (
    "unreachable", "identity_mismatch", "engine_geometry_mismatch", "probe_schema_mismatch", "token_mismatch",
    "challenge_timeout", "challenge_failed", "contract_reject",
)
_TOKENIZE_KEYS = {"tokens", "count", "max_model_len"}


class Fence(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class Echoes:
    """BlockStored pages per worker, captured from the KV thread while a challenge is armed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}

    def on_delivery(self, worker_id: str, delivery: Delivery) -> None:
        if delivery.batch is None:
            return
        with self._lock:
            sink = self._armed.get(worker_id)
            if sink is None:
                return
            for ev in delivery.batch.events:
                if type(ev).__name__ != "BlockStored":
                    continue
                size = ev.block_size
                for i, h in enumerate(ev.block_hashes):
                    sink.append((h, delivery.batch.rank, tuple(ev.token_ids[i * size : (i + 1) * size])))

    def arm(self, worker_id: str) -> None:
        with self._lock:
            self._armed[worker_id] = []

    def take(self, worker_id: str, disarm: bool = False) -> list[tuple[int, int, tuple[int, ...]]]:
        with self._lock:
            got = list(self._armed.get(worker_id, ()))
            if disarm:
                self._armed.pop(worker_id, None)
            return got


def check_identity(worker: Worker, found: Discovery, cfg: GatewayConfig) -> str:
    """The contract id for the worker, or Fence: version, model and geometry as configured."""
    spec = worker.spec
    try:
        contract = for_version(found.version)
    except UsageError as exc:
        raise Fence("identity_mismatch", str(exc)) from None
    if spec.sglang_version is not None and spec.sglang_version != found.version:
        raise Fence("identity_mismatch", f"configured SGLang {spec.sglang_version}, worker runs {found.version}")
    if spec.model is not None and spec.model != found.model:
        raise Fence("identity_mismatch", f"configured model {spec.model}, worker serves {found.model}")
    if found.model not in cfg.models:
        raise Fence("identity_mismatch", f"worker serves {found.model!r}, which has no tokenization profile")
    if found.kv_port is None:
        raise Fence("engine_geometry_mismatch", "the worker publishes no KV events")
    for name, configured, actual in (
        ("page size", spec.page_size, found.page_size),
        ("KV event port base", spec.kv_port, found.kv_port),
        ("DP size", spec.dp_size, found.dp_size),
    ):
        if configured is not None and configured != actual:
            raise Fence("engine_geometry_mismatch", f"configured {name} {configured}, worker reports {actual}")
    return contract.id


async def token_parity(client: httpx.AsyncClient, worker: Worker, model: str, profile: Profile,
                       probes: list[str], timeout_s: float) -> None:
    """Every probe (as a prompt and as a chat) must tokenize on the worker exactly as here."""
    for text in probes:
        for body, mine in (
            ({"model": model, "prompt": text}, profile.encode(text)),
            *(
                [({"model": model, "messages": [{"role": "user", "content": text}]},
                  profile.encode_chat([{"role": "user", "content": text}]))]
                if profile.template is not None else []
            ),
        ):
            try:
                resp = await client.post(f"{worker.url}/v1/tokenize", json=body, timeout=timeout_s)
                got: Any = resp.json() if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                resp, got = None, None
            if (
                not isinstance(got, dict)
                or set(got) != _TOKENIZE_KEYS
                or not isinstance(got["tokens"], list)
                or not all(type(t) is int for t in got["tokens"])
                or got["count"] != len(got["tokens"])
            ):
                status = "no response" if resp is None else f"HTTP {resp.status_code}"
                expected = "{tokens, count, max_model_len}"
                raise Fence("probe_schema_mismatch", f"/v1/tokenize answered {status}, not {expected}")
            if got["tokens"] != mine:
                raise Fence("token_mismatch", f"probe {text!r}: worker {got['tokens'][:12]}..., gateway {mine[:12]}...")


async def hash_challenge(client: httpx.AsyncClient, worker: Worker, model: str, profile: Profile,
                         echoes: Echoes, timeout_s: float) -> None:
    """A nonce prompt of >= 2 full pages; its predicted BlockStored pages must come back on one rank."""
    page = worker.discovery.page_size  # type: ignore[union-attr]
    prompt = f"{secrets.token_hex(16)} cacheon attestation"  # nonce first: no page can be cached
    # Pages made only of what precedes the nonce (a BOS quirk) may be cached already: not due.
    skip = len(profile.encode_completion("")) // page
    tokens = profile.encode_completion(prompt)
    while len(tokens) < (skip + 2) * page + 1:
        prompt += " the quick brown fox"
        tokens = profile.encode_completion(prompt)
    chain = page_hashes(tokens, page)[skip:]
    pages = {tuple(tokens[(skip + i) * page : (skip + i + 1) * page]): h for i, h in enumerate(chain)}
    echoes.arm(worker.id)
    try:
        try:
            resp = await client.post(f"{worker.url}/v1/completions", timeout=timeout_s,
                                     json={"model": model, "prompt": prompt, "max_tokens": 1})
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise Fence("challenge_failed", f"challenge request failed: {exc!r}") from None
        deadline = time.monotonic() + timeout_s
        while True:
            seen = echoes.take(worker.id)
            wrong = [h for h, _rank, toks in seen if toks in pages and pages[toks] != h]
            if wrong:
                raise Fence("challenge_failed", f"echoed block id {wrong[0]} where {len(chain)} predicted ids were due")
            ranks = {rank for h, rank, _ in seen if h in chain}
            if len(ranks) > 1:
                raise Fence("challenge_failed", f"the challenge's pages were echoed split across ranks {sorted(ranks)}")
            if set(chain) <= {h for h, _, _ in seen}:
                return
            if time.monotonic() > deadline:
                got = len(set(chain) & {h for h, _, _ in seen})
                raise Fence("challenge_timeout", f"{got}/{len(chain)} predicted pages echoed in {timeout_s:g}s")
            await asyncio.sleep(0.02)
    finally:
        echoes.take(worker.id, disarm=True)


async def run_ladder(client: httpx.AsyncClient, worker: Worker, cfg: GatewayConfig, profiles: dict[str, Profile],
                     echoes: Echoes, subscribe: Any) -> None:
    """Climb the ladder; on any failure the worker is fenced first (state FENCED), then it reports."""
    try:
        try:
            found = await discover(client, worker.url, cfg.request_timeout_s)
        except DiscoveryError as exc:
            raise Fence("unreachable", str(exc)) from None
        worker.contract_id = check_identity(worker, found, cfg)
        worker.discovery = found
        subscribe(worker)
        worker.set_state(PROFILE_VALIDATED)
        profile = profiles[found.model]
        await token_parity(client, worker, found.model, profile, cfg.probes, cfg.request_timeout_s)
        worker.set_state(TOKEN_PARITY_VERIFIED)
        for attempt in (1, 2):  # a first challenge can race the SUB's connect (slow joiner)
            try:
                await hash_challenge(client, worker, found.model, profile, echoes, cfg.challenge_timeout_s)
                break
            except Fence as fence:
                if fence.reason != "challenge_timeout" or attempt == 2:
                    raise
        worker.set_state(ENGINE_HASH_ATTESTED)
        worker.set_state(READY)
    except Fence as fence:
        worker.set_state(FENCED, fence.reason, fence.detail)
