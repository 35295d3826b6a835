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

import aiohttp

from cacheon.errors import UsageError
from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.contracts import for_version
from cacheon.gateway.hashing import page_hashes
from cacheon.gateway.http import CallError, call_json
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
        # A worker whose server args name no replay endpoint may still have one the operator knows of.
        ("KV replay port base", spec.kv_replay_port, found.replay_port or spec.kv_replay_port),
    ):
        if configured is not None and configured != actual:
            raise Fence("engine_geometry_mismatch", f"configured {name} {configured}, worker reports {actual}")
    return contract.id


async def token_parity(client: aiohttp.ClientSession, worker: Worker, model: str, profile: Profile,
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
                status, got = await call_json(client, "POST", f"{worker.url}/v1/tokenize", timeout_s, body)
            except CallError:
                status, got = None, None
            if status != 200:
                got = None
            if (
                not isinstance(got, dict)
                or set(got) != _TOKENIZE_KEYS
                or not isinstance(got["tokens"], list)
                or not all(type(t) is int for t in got["tokens"])
                or got["count"] != len(got["tokens"])
            ):
                answer = "no response" if status is None else f"HTTP {status}"
                expected = "{tokens, count, max_model_len}"
                raise Fence("probe_schema_mismatch", f"/v1/tokenize answered {answer}, not {expected}")
            if got["tokens"] != mine:
                raise Fence("token_mismatch", f"probe {text!r}: worker {got['tokens'][:12]}..., gateway {mine[:12]}...")


def _echoed(seen: list[tuple[int, int, tuple[int, ...]]], pages: list[tuple[int, ...]], chain: list[int]) -> bool:
    """True once the challenge's pages came back right, False while not all are in; Fence if wrong.

    Pages are matched by position, as the run of the challenge's page tokens in publishing order
    on one rank: tokens alone cannot key a page (at page size 1 the same token recurs).
    """
    predicted = set(chain)
    ranks = {rank for h, rank, _ in seen if h in predicted}
    if len(ranks) > 1:
        raise Fence("challenge_failed", f"the challenge's pages were echoed split across ranks {sorted(ranks)}")
    by_rank: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for h, rank, toks in seen:
        by_rank.setdefault(rank, []).append((h, toks))
    for run in by_rank.values():
        toks = [t for _, t in run]
        for start in range(len(run) - len(pages) + 1):
            if toks[start : start + len(pages)] == pages:
                got = [h for h, _ in run[start : start + len(pages)]]
                bad = next((i for i, (g, want) in enumerate(zip(got, chain, strict=True)) if g != want), None)
                if bad is not None:
                    raise Fence("challenge_failed", f"page {bad} echoed block id {got[bad]}, predicted {chain[bad]}")
                return True
    return False


async def hash_challenge(client: aiohttp.ClientSession, worker: Worker, model: str, profile: Profile,
                         echoes: Echoes, timeout_s: float) -> None:
    """A nonce prompt of >= 2 full pages; its predicted BlockStored pages must come back on one rank."""
    rejected_before = worker.rejects()
    page = worker.discovery.page_size  # type: ignore[union-attr]
    prompt = f"{secrets.token_hex(16)} cacheon attestation"  # nonce first: no page can be cached
    # Pages made only of what precedes the nonce (a BOS quirk) may be cached already: not due.
    skip = len(profile.encode_completion("")) // page
    tokens = profile.encode_completion(prompt)
    while len(tokens) < (skip + 2) * page + 1:
        prompt += " the quick brown fox"
        tokens = profile.encode_completion(prompt)
    chain = page_hashes(tokens, page)[skip:]
    pages = [tuple(tokens[i * page : (i + 1) * page]) for i in range(skip, skip + len(chain))]
    echoes.arm(worker.id)
    try:
        try:
            status, _ = await call_json(client, "POST", f"{worker.url}/v1/completions", timeout_s,
                                        {"model": model, "prompt": prompt, "max_tokens": 1})
        except CallError as exc:
            raise Fence("challenge_failed", f"challenge request failed: {exc}") from None
        if status != 200:
            raise Fence("challenge_failed", f"challenge request answered HTTP {status}")
        deadline = time.monotonic() + timeout_s
        while True:
            seen = echoes.take(worker.id)
            if _echoed(seen, pages, chain):
                return
            if worker.rejects() > rejected_before:  # the echo may be among the batches the decoder refused
                raise Fence("contract_reject", f"{worker.rejects() - rejected_before} KV batch(es) refused by the "
                            f"{worker.contract_id} decoder during the challenge")
            if time.monotonic() > deadline:
                got = len(set(chain) & {h for h, _, _ in seen})
                raise Fence("challenge_timeout", f"{got}/{len(chain)} predicted pages echoed in {timeout_s:g}s")
            await asyncio.sleep(0.02)
    finally:
        echoes.take(worker.id, disarm=True)


async def run_ladder(client: aiohttp.ClientSession, worker: Worker, cfg: GatewayConfig, profiles: dict[str, Profile],
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
