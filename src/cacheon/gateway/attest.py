"""The exact-attestation ladder: prove a worker tokenizes and hashes as predicted before routing on it.

PROFILE_VALIDATED (identity, geometry) -> TOKEN_PARITY_VERIFIED (probe texts tokenize identically)
-> ENGINE_HASH_ATTESTED (a nonce prompt's pages come back as exactly the predicted BlockStored
events, on one rank) -> READY. A failure fences the worker off exact routing with a reason.
The ladder only reads the worker: it hands each rung back (``climb``) and the fleet applies it.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

import aiohttp

from cacheon.errors import UsageError
from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.http import CallError, call_json
from cacheon.gateway.workers import Discovery, DiscoveryError, FenceReason, Worker, WorkerState, discover
from cacheon.kv.contracts import for_version
from cacheon.kv.events import BlockStored
from cacheon.kv.feed import Delivery
from cacheon.tokens.profile import TokenizerProfile

_TOKENIZE_KEYS = {"tokens", "count", "max_model_len"}
# SpeculativeAlgorithm.is_eagle() in every release here (NEXTN is an alias of EAGLE: spec_registry
# _RESERVED_ALIASES): the radix cache then runs with is_eagle and hashes (token, next token) pairs.
BIGRAM_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "FROZEN_KV_MTP", "NEXTN"})
Echo = tuple[int | None, int, tuple[int, ...]]  # block id, rank, the page's tokens; a gap: (None, rank, ())
Hasher = Callable[[Sequence[int], int], list[int]]  # tokens, page size -> block ids


@dataclass(frozen=True)
class Rung:
    """One step of the ladder as it reports it: the state reached, or FENCED with a reason.

    PROFILE_VALIDATED carries what identity checking found, for the fleet to subscribe to.
    """

    state: WorkerState
    reason: FenceReason | None = None
    detail: str | None = None
    discovery: Discovery | None = None
    contract_id: str | None = None


class Fence(Exception):
    def __init__(self, reason: FenceReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


class Echoes:
    """BlockStored pages per worker, captured from the KV thread while a challenge is armed.

    Only pages that may be the challenge's are kept (its page tokens), each run of others as one gap,
    so a run of kept pages is one the worker published together. A gateway that joins a busy plane arms
    its challenge while it replays the stream: keeping every page then held the whole backlog, and
    each 20 ms look rescanned it (benchmarks/README.md, a restarted replica)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, _Armed] = {}

    def on_delivery(self, worker_id: str, delivery: Delivery) -> None:
        if delivery.batch is None:
            return
        with self._lock:
            armed = self._armed.get(worker_id)
            if armed is None:
                return
            rank = delivery.batch.rank
            for ev in delivery.batch.events:
                if not isinstance(ev, BlockStored):
                    continue
                size, tokens = ev.block_size, ev.tokens()
                if armed.firsts.isdisjoint(tokens[::size]):  # no page of it starts as one of the challenge's
                    armed.gap(rank)
                    continue
                for i, h in enumerate(ev.block_hashes):
                    page = tuple(tokens[i * size : (i + 1) * size])
                    if page in armed.pages:
                        armed.keep(h, rank, page)
                    else:
                        armed.gap(rank)

    def arm(self, worker_id: str, pages: Sequence[tuple[int, ...]]) -> None:
        """Capture the worker's pages that hold one of ``pages``' tokens, from now until disarmed."""
        with self._lock:
            self._armed[worker_id] = _Armed(pages)

    def take(self, worker_id: str, disarm: bool = False) -> list[Echo]:
        with self._lock:
            armed = self._armed.get(worker_id)
            got = list(armed.sink) if armed is not None else []
            if disarm:
                self._armed.pop(worker_id, None)
            return got


class _Armed:
    """One armed challenge: its pages, their first tokens (a quick reject per event) and what was kept."""

    __slots__ = ("firsts", "gapped", "pages", "sink")

    def __init__(self, pages: Sequence[tuple[int, ...]]) -> None:
        self.pages, self.firsts = set(pages), {page[0] for page in pages if page}
        self.sink: list[Echo] = []
        self.gapped: set[int] = set()  # ranks whose last entry is a gap

    def keep(self, h: int, rank: int, page: tuple[int, ...]) -> None:
        self.sink.append((h, rank, page))
        self.gapped.discard(rank)

    def gap(self, rank: int) -> None:
        """Pages left out on ``rank`` (once per run of them): those before and after were not published together."""
        if rank not in self.gapped:
            self.sink.append((None, rank, ()))
            self.gapped.add(rank)


def check_identity(worker: Worker, found: Discovery, cfg: GatewayConfig) -> str:
    """The contract id for the worker, or Fence: version, model and geometry as configured."""
    spec = worker.spec
    try:
        contract = for_version(found.version)
    except UsageError as exc:
        raise Fence(FenceReason.IDENTITY_MISMATCH, str(exc)) from None
    if spec.sglang_version is not None and spec.sglang_version != found.version:
        raise Fence(FenceReason.IDENTITY_MISMATCH,
                    f"configured SGLang {spec.sglang_version}, worker runs {found.version}")
    if spec.model is not None and spec.model != found.model:
        raise Fence(FenceReason.IDENTITY_MISMATCH, f"configured model {spec.model}, worker serves {found.model}")
    if found.model not in cfg.models:
        raise Fence(FenceReason.IDENTITY_MISMATCH, f"worker serves {found.model!r}, which has no tokenization profile")
    if found.kv_port is None:
        raise Fence(FenceReason.ENGINE_GEOMETRY_MISMATCH, "the worker publishes no KV events")
    if found.speculative is not None and found.speculative.upper() in BIGRAM_ALGORITHMS:
        raise Fence(FenceReason.HASH_SCHEME_UNSUPPORTED,
                    f"speculative {found.speculative} keys cache pages by token bigrams, which {contract.id} "
                    "does not declare (its events would publish token pairs and ids no plain chain predicts)")
    for name, configured, actual in (
        ("page size", spec.page_size, found.page_size),
        ("KV event port base", spec.kv_port, found.kv_port),
        ("DP size", spec.dp_size, found.dp_size),
        # A worker whose server args name no replay endpoint may still have one the operator knows of.
        ("KV replay port base", spec.kv_replay_port, found.replay_port or spec.kv_replay_port),
    ):
        if configured is not None and configured != actual:
            raise Fence(FenceReason.ENGINE_GEOMETRY_MISMATCH,
                        f"configured {name} {configured}, worker reports {actual}")
    return contract.id


async def token_parity(client: aiohttp.ClientSession, worker: Worker, model: str, profile: TokenizerProfile,
                       probes: list[str], timeout_s: float) -> None:
    """Every probe (as a prompt and as a chat) must tokenize on the worker exactly as here."""
    for text in probes:
        for body, mine in (
            ({"model": model, "prompt": text}, profile.encode(text)),
            *(
                [({"model": model, "messages": [{"role": "user", "content": text}]},
                  profile.encode_chat({"messages": [{"role": "user", "content": text}]}))]
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
                raise Fence(FenceReason.PROBE_SCHEMA_MISMATCH, f"/v1/tokenize answered {answer}, not {expected}")
            if got["tokens"] != mine:
                raise Fence(FenceReason.TOKEN_MISMATCH,
                            f"probe {text!r}: worker {got['tokens'][:12]}..., gateway {mine[:12]}...")


def _echoed(seen: list[Echo], pages: list[tuple[int, ...]], chain: list[int]) -> bool:
    """True once the challenge's pages came back right, False while not all are in; Fence if wrong.

    Pages are matched by position, as the run of the challenge's page tokens in publishing order
    on one rank: tokens alone cannot key a page (at page size 1 the same token recurs).
    """
    predicted = set(chain)
    ranks = {rank for h, rank, _ in seen if h in predicted}
    if len(ranks) > 1:
        raise Fence(FenceReason.CHALLENGE_FAILED,
                    f"the challenge's pages were echoed split across ranks {sorted(ranks)}")
    runs: dict[int, list[list[tuple[int, tuple[int, ...]]]]] = {}  # per rank, split at the gaps
    for h, rank, toks in seen:
        split = runs.setdefault(rank, [[]])
        if h is None:
            split.append([])
        else:
            split[-1].append((h, toks))
    for run in (run for split in runs.values() for run in split):
        published = [t for _, t in run]
        for start in range(len(run) - len(pages) + 1):
            if published[start : start + len(pages)] == pages:
                got = [h for h, _ in run[start : start + len(pages)]]
                bad = next((i for i, (g, want) in enumerate(zip(got, chain, strict=True)) if g != want), None)
                if bad is not None:
                    raise Fence(FenceReason.CHALLENGE_FAILED,
                                f"page {bad} echoed block id {got[bad]}, predicted {chain[bad]}")
                return True
    return False


async def hash_challenge(client: aiohttp.ClientSession, worker: Worker, found: Discovery, contract_id: str,
                         profile: TokenizerProfile, echoes: Echoes, hasher: Hasher, timeout_s: float) -> None:
    """A nonce prompt of >= 2 full pages; its predicted BlockStored pages must come back on one rank."""
    rejected_before = worker.rejects()
    model, page = found.model, found.page_size
    prompt = f"{secrets.token_hex(16)} cacheon attestation"  # nonce first: no page can be cached
    # Pages made only of what precedes the nonce (a BOS quirk) may be cached already: not due.
    skip = len(profile.encode_completion("")) // page
    tokens = profile.encode_completion(prompt)
    while len(tokens) < (skip + 2) * page + 1:
        prompt += " the quick brown fox"
        tokens = profile.encode_completion(prompt)
    chain = hasher(tokens, page)[skip:]
    pages = [tuple(tokens[i * page : (i + 1) * page]) for i in range(skip, skip + len(chain))]
    echoes.arm(worker.id, pages)
    try:
        try:
            status, _ = await call_json(client, "POST", f"{worker.url}/v1/completions", timeout_s,
                                        {"model": model, "prompt": prompt, "max_tokens": 1})
        except CallError as exc:
            raise Fence(FenceReason.CHALLENGE_FAILED, f"challenge request failed: {exc}") from None
        if status != 200:
            raise Fence(FenceReason.CHALLENGE_FAILED, f"challenge request answered HTTP {status}")
        deadline = time.monotonic() + timeout_s
        while True:
            seen = echoes.take(worker.id)
            if _echoed(seen, pages, chain):
                return
            if worker.rejects() > rejected_before:  # the echo may be among the batches the decoder refused
                raise Fence(FenceReason.CONTRACT_REJECT,
                            f"{worker.rejects() - rejected_before} KV batch(es) refused by the "
                            f"{contract_id} decoder during the challenge")
            if time.monotonic() > deadline:
                got = len(set(chain) & {h for h, _, _ in seen})
                raise Fence(FenceReason.CHALLENGE_TIMEOUT,
                            f"{got}/{len(chain)} predicted pages echoed in {timeout_s:g}s")
            await asyncio.sleep(0.02)
    finally:
        echoes.take(worker.id, disarm=True)


async def climb(client: aiohttp.ClientSession, worker: Worker, cfg: GatewayConfig,
                profiles: dict[str, TokenizerProfile], echoes: Echoes, hasher: Hasher) -> AsyncGenerator[Rung, None]:
    """Climb the ladder, one rung at a time; the last rung is READY or FENCED.

    The consumer applies each rung before asking for the next: after PROFILE_VALIDATED the
    worker's KV feeds must be up, since the hash challenge listens on them.
    """
    try:
        try:
            found = await discover(client, worker.url, cfg.request_timeout_s)
        except DiscoveryError as exc:
            raise Fence(FenceReason.UNREACHABLE, str(exc)) from None
        contract_id = check_identity(worker, found, cfg)
        yield Rung(WorkerState.PROFILE_VALIDATED, discovery=found, contract_id=contract_id)
        profile = profiles[found.model]
        await token_parity(client, worker, found.model, profile, cfg.probes, cfg.request_timeout_s)
        yield Rung(WorkerState.TOKEN_PARITY_VERIFIED)
        for attempt in (1, 2):  # a first challenge can race the SUB's connect (slow joiner)
            try:
                await hash_challenge(client, worker, found, contract_id, profile, echoes, hasher,
                                     cfg.challenge_timeout_s)
                break
            except Fence as fence:
                if fence.reason != FenceReason.CHALLENGE_TIMEOUT or attempt == 2:
                    raise
        yield Rung(WorkerState.ENGINE_HASH_ATTESTED)
        yield Rung(WorkerState.READY)
    except Fence as fence:
        yield Rung(WorkerState.FENCED, fence.reason, fence.detail)
