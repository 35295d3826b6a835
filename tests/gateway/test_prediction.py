"""What the exact policy predicts an engine reuses: SGLang's caps (last token, logprob start) and its
cache namespaces (cache_salt per release, extra_key), each beside a control without the cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheon.gateway.attest import Fence, check_identity
from cacheon.gateway.config import WorkerSpec, parse
from cacheon.gateway.policy import Exact
from cacheon.gateway.prediction import NoPrediction, Reuse, chain_prior
from cacheon.gateway.prompt import Chat, Completion, Generate, Request, reuse_of
from cacheon.gateway.workers import Discovery, FenceReason, Worker, WorkerState
from cacheon.kv.hashing import page_hashes, salt_seed
from cacheon.kv.index import BlockIndex
from cacheon.sim.tokenizer import gateway_model
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.chat import ChatRefusal
from tests.gateway.snapshots import choose

PAGE = 4
TOKENS = list(range(100, 100 + 3 * PAGE))  # exactly three pages


def _worker(wid: str, version: str, contract: str) -> Worker:
    w = Worker(wid, WorkerSpec(url=f"http://{wid}:1"), discovery=Discovery(version, "demo", PAGE, 1, 1))
    w.state, w.contract_id = WorkerState.READY, contract
    return w


def _policy(index: BlockIndex) -> Exact:
    return Exact(index, ChainCache())


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        (Completion(), 11),  # len - 1: the last token's logits are always computed
        (Completion(echo=True), 11),  # echo alone asks for no logprobs
        (Completion(logprobs=1), 11),  # nor do completion logprobs alone
        (Completion(echo=True, logprobs=1), 0),  # prompt logprobs from token 0
        (Generate(return_logprob=True, logprob_start_len=5), 5),
        (Generate(logprob_start_len=5), 11),  # a start without return_logprob caps nothing
        (Generate(return_logprob=True, logprob_start_len=40), 11),  # past the end: len - 1 still
        (Chat(), 11),  # chat logprobs are the completion's, not the prompt's
    ],
)
def test_the_reuse_cap_is_the_engines(body: Request, limit: int) -> None:
    assert reuse_of(body, len(TOKENS)) == Reuse(limit)


def test_namespaces_the_events_do_not_show_are_refused_with_a_reason() -> None:
    assert reuse_of(Completion(extra_key="x"), 12).refusal is NoPrediction.NAMESPACE_NOT_PUBLISHED
    assert reuse_of(Completion(lora_path="a"), 12).refusal is NoPrediction.NAMESPACE_NOT_PUBLISHED
    assert reuse_of(Completion(cache_salt=7), 12).refusal is NoPrediction.NAMESPACE_NOT_PUBLISHED
    assert reuse_of(Completion(cache_salt=""), 12) == Reuse(11)  # SGLang ignores an empty salt
    assert reuse_of(Completion(cache_salt="t"), 12) == Reuse(11, "t")


def test_the_salt_seed_applies_where_the_contract_declares_it_and_is_refused_elsewhere() -> None:
    salted = Reuse(11, "tenant-a")
    assert chain_prior("sglang-kv-rank-v4", salted) == salt_seed("tenant-a")
    assert chain_prior("sglang-kv-rank-v2", salted) == salt_seed("tenant-a")
    assert chain_prior("sglang-kv-rank-v1", salted) is NoPrediction.SALT_NOT_PUBLISHED  # the pin
    assert chain_prior("sglang-kv-rank-v1", Reuse(11)) == b""
    assert salt_seed("tenant-a") != salt_seed("tenant-b")


def test_an_identical_repeat_is_predicted_one_page_short() -> None:
    index = BlockIndex()
    index.apply(("a", 0), [("store", page_hashes(TOKENS, PAGE), None)])  # all three pages cached
    policy = _policy(index)
    a = _worker("a", "0.5.22", "sglang-kv-rank-v4")
    assert choose(policy, [a], TOKENS, reuse_of(Completion(), len(TOKENS))).held == 2 * PAGE
    assert choose(policy, [a], TOKENS).held == 3 * PAGE  # control: without the cap, the whole prompt
    echo = reuse_of(Completion(echo=True, logprobs=1), len(TOKENS))
    decision = choose(policy, [a], TOKENS, echo)
    assert (decision.held, decision.predicted) == (0, True)  # predicted: nothing reused, which is exact


def test_salted_chains_are_predicted_on_seeded_workers_and_refused_on_the_pin() -> None:
    index = BlockIndex()
    index.apply(("new", 0), [("store", page_hashes(TOKENS, PAGE, salt_seed("t")), None)])
    index.apply(("pin", 0), [("store", page_hashes(TOKENS, PAGE), None)])
    policy = _policy(index)
    new, pin = _worker("new", "0.5.22", "sglang-kv-rank-v4"), _worker("pin", "0.5.13.post1", "sglang-kv-rank-v1")
    salted = reuse_of(Completion(cache_salt="t"), len(TOKENS))
    decision = choose(policy, [new], TOKENS, salted)
    assert (decision.held, decision.predicted, decision.refused) == (2 * PAGE, True, None)
    assert choose(policy, [new], TOKENS, Reuse(11, "u")).held == 0  # another tenant's namespace
    assert choose(policy, [new], TOKENS, Reuse(11)).held == 0  # control: the plain chain is not there
    decision = choose(policy, [pin], TOKENS, salted)
    assert (decision.held, decision.predicted, decision.refused) == (0, False, NoPrediction.SALT_NOT_PUBLISHED)
    assert choose(policy, [pin], TOKENS, Reuse(11)).held == 2 * PAGE  # unsalted, the pin's ids do predict


@pytest.mark.parametrize(("speculative", "fenced"), [("EAGLE", True), ("eagle3", True), ("NEXTN", True),
                                                      ("NGRAM", False), (None, False)])
def test_a_worker_keying_pages_by_bigrams_is_fenced_with_a_reason(
        tmp_path: Path, profile: tuple[Path, Path], speculative: str | None, fenced: bool) -> None:
    cfg = parse({"policy": "exact", "models": {"demo": gateway_model(*profile)}}, tmp_path, {})
    found = Discovery("0.5.23", "demo", PAGE, 1, 5557, speculative=speculative)
    worker = Worker("w", WorkerSpec(url="http://w:1"))
    if not fenced:  # control: plain chains (NGRAM drafts without an EAGLE radix key) attest as usual
        assert check_identity(worker, found, cfg) == "sglang-kv-rank-v4"
        return
    with pytest.raises(Fence) as raised:
        check_identity(worker, found, cfg)
    assert raised.value.reason is FenceReason.HASH_SCHEME_UNSUPPORTED


def test_every_chat_refusal_is_a_prediction_refusal_the_gateway_can_report() -> None:
    # The proxy reports a chat it cannot render as NoPrediction(reason): a reason missing here would be a 500.
    assert {r.value for r in ChatRefusal} <= {r.value for r in NoPrediction}
