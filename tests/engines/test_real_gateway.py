"""The gateway against real SGLang workers on CPU: ``cacheon gateway serve`` (exact policy) in front of
a 0.5.13.post1 (the pin, tagged arrays) and a 0.5.23 (tagged maps) server at page size 16, each
registered by URL alone, driven with the official ``openai`` client.

Every answered request the gateway predicted for is scored: the gateway's predicted cached tokens
(``x-cacheon-predicted-cached-tokens``, and ``/status`` / ``/metrics`` per worker) against what the
engine reports (``usage.prompt_tokens_details.cached_tokens``, ``meta_info.cached_tokens``). The
known prediction bugs each have a test here: the last-token cap, the logprob start, salted requests,
and BOS taken from the model's tokenizer_config.json. The deliberate mismatch here is the pin's salted
pages (published under the plain ids); a flush with no event is the simulator's (its real flush publishes
AllBlocksCleared, the control here). Besides the two-worker gateway, one gateway per
worker runs the per-release scenarios, so each request's worker is known (a gateway is cheap; ZMQ fans
each worker's events out to every gateway). The servers are the pool's (the last two hash-parity
ran); the restart test, last, boots the 0.5.23 one again on the same ports.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest

from cacheon.sim.launch import GatewayProcess, wait_until
from tests.engines.conftest import serve
from tests.engines.server import SERVED_MODEL_NAME, EngineServer, EngineSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PIN, LATEST = "0.5.13.post1", "0.5.23"
PAGE = 16
SPECS = {PIN: EngineSpec(PIN, PAGE), LATEST: EngineSpec(LATEST, PAGE)}
TEXT = "The quick brown fox jumps over the lazy dog while the cache warms up. "


class Fleet:
    """The two servers and the gateways in front of them."""

    def __init__(self, servers: dict[str, EngineServer], gateways: dict[str, GatewayProcess]) -> None:
        self.servers, self.gateways = servers, gateways

    def client(self, gateway: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateways[gateway].url}/v1", api_key="unused", timeout=120, max_retries=0)

    def worker(self, gateway: str, release: str) -> dict[str, Any]:
        return self.gateways[gateway].status()[self.servers[release].url]

    def settle(self, quiet_s: float = 0.6) -> None:
        """Wait until every gateway has applied every KV batch each server published so far."""
        for server in self.servers.values():
            server.feed.wait_quiet(0, quiet_s=quiet_s, timeout_s=10)
            published = max((seq for _, seq, _ in server.feed.since(server.run_frames)), default=None)
            if published is None:
                continue
            for gw in self.gateways.values():
                if server.url in gw.status():
                    wait_until(lambda gw=gw, s=server, n=published: gw.status()[s.url]["last_seq"].get("0") == n,
                               f"{gw.url} to apply seq {published} of {server.spec.label}", 30)


@pytest.fixture(scope="module")
def fleet(engine_pool, tmp_path_factory):
    servers = {release: serve(engine_pool, spec) for release, spec in SPECS.items()}
    model_dir = servers[PIN].model["path"]
    tmp = tmp_path_factory.mktemp("gateways")
    with ExitStack() as stack:
        # The model named by its directory (two-worker gateway) or its tokenizer.json: either way the
        # profile reads BOS, EOS and the chat template from the files beside it, as the engine does.
        def gateway(releases: list[str], tokenizer: str) -> GatewayProcess:
            return GatewayProcess(stack, tmp, None, "exact", [{"url": servers[r].url} for r in releases],
                                  models={SERVED_MODEL_NAME: {"tokenizer": tokenizer}}, health_interval_s=1.0,
                                  challenge_timeout_s=20, request_timeout_s=120)

        gateways = {
            "both": gateway([PIN, LATEST], model_dir),
            PIN: gateway([PIN], f"{model_dir}/tokenizer.json"),
            LATEST: gateway([LATEST], f"{model_dir}/tokenizer.json"),
        }
        for gw in gateways.values():
            gw.settled([u for u in gw.status()])
        yield Fleet(servers, gateways)


def _cached(usage: Any) -> int:
    """The engine's cached prompt tokens from an openai usage object (servers run --enable-cache-report;
    the pin writes prompt_tokens_details null for 0)."""
    details = usage.prompt_tokens_details
    return 0 if details is None else details.cached_tokens


def complete(fleet: Fleet, gateway: str, prompt: Any, **extra: Any) -> tuple[httpx.Headers, int, Any]:
    """One completion through a gateway: the response headers, the engine's cached tokens, the body."""
    raw = fleet.client(gateway).completions.with_raw_response.create(
        model=SERVED_MODEL_NAME, prompt=prompt, max_tokens=2, temperature=0, **extra)
    done = raw.parse()
    fleet.settle()
    return raw.headers, _cached(done.usage), done


def predicted(headers: httpx.Headers) -> int | None:
    value = headers.get("x-cacheon-predicted-cached-tokens")
    return None if value is None else int(value)


def prompt(seed: int, length: int) -> list[int]:
    """A token-id prompt (BOS first) no other test sends: ``length`` exactly, for page arithmetic."""
    return [0] + [10 + (seed * 53 + i * 29) % 900 for i in range(length - 1)]


def precision(fleet: Fleet, gateway: str, release: str) -> dict[str, Any]:
    return fleet.worker(gateway, release)["precision"]


# -- discovery, the ladder, routing, streaming ---------------------------------------------------


def test_workers_registered_by_url_alone_are_discovered_and_attested_to_ready(fleet) -> None:
    status = fleet.gateways["both"].status()
    for release, server in fleet.servers.items():
        w = status[server.url]
        assert (w["version"], w["model"], w["ladder"]["state"]) == (release, SERVED_MODEL_NAME, "READY"), w
        assert w["subscribed"] and w["indexed_blocks"] > 0  # the hash challenge's pages, at least
        assert w["kv_replay_port"] == int(server.replay_endpoint.rsplit(":", 1)[1])
    assert {w["contract"] for w in status.values()} == {"sglang-kv-rank-v1", "sglang-kv-rank-v4"}
    assert httpx.get(f"{fleet.gateways['both'].url}/readyz").status_code == 200


def test_the_openai_client_routes_by_prefix_and_streams_with_exact_predictions(fleet) -> None:
    client = fleet.client("both")
    text = TEXT * 3
    first, cached, done = complete(fleet, "both", text)
    assert done.choices[0].text and first["x-cacheon-route"].startswith("exact:")
    assert predicted(first) == cached
    again, cached, _ = complete(fleet, "both", text + "and then some more")
    assert (again["x-cacheon-route"], again["x-cacheon-worker"]) == ("exact:prefix_hit", first["x-cacheon-worker"])
    assert predicted(again) == cached > 0

    raw = client.completions.with_raw_response.create(model=SERVED_MODEL_NAME, prompt=text, max_tokens=3,
                                                      temperature=0, stream=True,
                                                      stream_options={"include_usage": True})
    chunks = list(raw.parse())
    # A chunk per detokenized step: fewer than 3 when the random model ends early or a token decodes
    # to part of a character (SGLang sends no empty delta); the usage chunk comes last, apart.
    assert 1 <= sum(1 for c in chunks if c.choices) <= chunks[-1].usage.completion_tokens <= 3
    assert not chunks[-1].choices
    assert raw.headers["x-cacheon-worker"] == first["x-cacheon-worker"]
    assert predicted(raw.headers) == _cached(chunks[-1].usage) > 0
    fleet.settle()

    messages = [{"role": "system", "content": TEXT * 2}, {"role": "user", "content": "hello"}]
    for _ in range(2):
        chat = client.chat.completions.with_raw_response.create(model=SERVED_MODEL_NAME, messages=messages, max_tokens=2)
        assert chat.parse().choices[0].message.content is not None
        assert predicted(chat.headers) == _cached(chat.parse().usage)
        fleet.settle()
    assert _cached(chat.parse().usage) > 0  # the repeat reused the first one's pages
    streamed = list(client.chat.completions.create(model=SERVED_MODEL_NAME, messages=messages, max_tokens=2, stream=True))
    assert next(c.choices[0].delta.content for c in streamed if c.choices) is not None
    fleet.settle()

    for release in fleet.servers:
        p = precision(fleet, "both", release)
        assert p["over"] == p["under"] == 0, p
        assert p["predicted_tokens"] == p["reported_tokens"]
    total = sum(precision(fleet, "both", r)["scored"] for r in fleet.servers)
    assert total >= 5
    assert sum(precision(fleet, "both", r)["unreported"] for r in fleet.servers) == 1  # the stream without usage


def test_a_token_id_past_the_model_vocabulary_is_refused_before_it_reaches_a_worker(fleet) -> None:
    """Such an id makes the real scheduler fail and the whole server exit (measured on both releases)."""
    vocab = fleet.servers[PIN].model["vocab_size"]
    with pytest.raises(openai.BadRequestError, match=f"token id {vocab} is outside the model's vocabulary"):
        fleet.client("both").completions.create(model=SERVED_MODEL_NAME, prompt=[0, 5, vocab], max_tokens=1)
    assert all(server.alive() for server in fleet.servers.values())


# -- the four prediction bugs, per release ---------------------------------------------------------


@pytest.mark.parametrize("release", [PIN, LATEST])
def test_an_identical_repeat_is_predicted_without_its_last_token(fleet, release) -> None:
    """SGLang caps a prefix match at len - 1 (the last token's logits), then at a page: a repeat of a
    3-page prompt reuses 2 pages, though all 3 are cached."""
    tokens = prompt(1, 3 * PAGE)
    headers, cached, _ = complete(fleet, release, tokens)
    assert (predicted(headers), cached) == (0, 0)
    headers, cached, _ = complete(fleet, release, tokens)
    assert cached == 2 * PAGE
    assert predicted(headers) == cached


@pytest.mark.parametrize("release", [PIN, LATEST])
def test_prompt_logprobs_cap_reuse_at_their_start(fleet, release) -> None:
    """``echo`` with ``logprobs`` asks for prompt logprobs from token 0: the engine reuses nothing; native
    ``logprob_start_len`` caps reuse at its page-floored start."""
    tokens = prompt(2, 3 * PAGE + 5)
    complete(fleet, release, tokens)
    headers, cached, done = complete(fleet, release, tokens, echo=True, logprobs=1)
    assert done.choices[0].logprobs is not None
    assert (predicted(headers), cached) == (0, 0)
    native = httpx.post(f"{fleet.gateways[release].url}/generate", timeout=120, json={
        "input_ids": tokens, "sampling_params": {"max_new_tokens": 1}, "return_logprob": True,
        "logprob_start_len": PAGE + 4})
    fleet.settle()
    assert native.status_code == 200, native.text
    assert native.json()["meta_info"]["cached_tokens"] == PAGE
    assert int(native.headers["x-cacheon-predicted-cached-tokens"]) == PAGE
    p = precision(fleet, release, release)
    assert p["over"] == p["under"] == 0, p


def test_salted_requests_are_predicted_from_the_salt_seed_where_the_release_publishes_it(fleet) -> None:
    """0.5.23 starts a salted chain from SHA-256("sglang-cache-salt-v1\\0" + salt): the second salted
    request is predicted exactly, and the salt keeps it apart from the same unsalted prompt."""
    tokens = prompt(3, 3 * PAGE)
    headers, cached, _ = complete(fleet, LATEST, tokens, extra_body={"cache_salt": "tenant-a"})
    assert (predicted(headers), cached) == (0, 0)
    headers, cached, _ = complete(fleet, LATEST, tokens, extra_body={"cache_salt": "tenant-a"})
    assert predicted(headers) == cached == 2 * PAGE
    for body in ({}, {"extra_body": {"cache_salt": "tenant-b"}}):  # another namespace reuses nothing
        headers, cached, _ = complete(fleet, LATEST, tokens, **body)
        assert predicted(headers) == cached == 0


def test_the_pin_refuses_to_predict_salted_requests_and_the_mismatch_they_cause_shows(fleet) -> None:
    """The pin keeps a salted request's pages in a namespace of their own but publishes them under the
    plain ids: the gateway refuses to predict salted requests there (a counted reason), and a plain
    request for the same prompt is then over-predicted: precision is where that shows."""
    before = precision(fleet, PIN, PIN)
    tokens = prompt(4, 3 * PAGE)
    for _ in range(2):
        headers, cached, _ = complete(fleet, PIN, tokens, extra_body={"cache_salt": "tenant-a"})
        assert headers["x-cacheon-prediction-refused"] == "salt_not_published"
        assert "x-cacheon-predicted-cached-tokens" not in headers
    assert cached == 2 * PAGE  # the engine did reuse its salted pages
    headers, cached, _ = complete(fleet, PIN, tokens)
    assert (predicted(headers), cached) == (2 * PAGE, 0)  # the ids say cached; the plain namespace is empty
    after = precision(fleet, PIN, PIN)
    assert after["refusals"]["salt_not_published"] == before["refusals"].get("salt_not_published", 0) + 2
    assert after["over"] == before["over"] + 1
    assert after["last_mismatch"]["predicted"] == 2 * PAGE and after["last_mismatch"]["reported"] == 0
    metrics = httpx.get(f"{fleet.gateways[PIN].url}/metrics").text
    wid = fleet.worker(PIN, PIN)["id"]
    assert re.search(rf'cacheon_prediction_scored_total{{match="over",worker="{wid}"}} {after["over"]}\.0', metrics)
    assert f'cacheon_prediction_refusals_total{{reason="salt_not_published",worker="{wid}"}}' in metrics


@pytest.mark.parametrize("release", [PIN, LATEST])
def test_chat_is_predicted_with_the_bos_the_tokenizer_config_names(fleet, release) -> None:
    """The chat template starts with ``{{ bos_token }}``; the profile was given only the tokenizer path,
    and took BOS from tokenizer_config.json beside it (the ladder's chat probes passed too)."""
    messages = [{"role": "user", "content": f"{release} " + TEXT * 3}]
    client = fleet.client(release)
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(model=SERVED_MODEL_NAME, messages=messages, max_tokens=2)
        fleet.settle()
        assert predicted(raw.headers) == _cached(raw.parse().usage)
    assert _cached(raw.parse().usage) > 0


def test_a_flush_published_as_all_blocks_cleared_empties_the_index_and_prediction_stays_exact(fleet) -> None:
    """Control for the deliberate mismatch (a flush no event reports: tests/gateway/test_gateway_precision.py):
    a real /flush_cache publishes AllBlocksCleared on the scheduler's next idle pass, which reaches both gateways."""
    tokens = prompt(6, 3 * PAGE)
    complete(fleet, PIN, tokens)
    headers, cached, _ = complete(fleet, PIN, tokens)
    assert predicted(headers) == cached == 2 * PAGE
    assert httpx.post(f"{fleet.servers[PIN].url}/flush_cache", timeout=30).status_code == 200
    fleet.settle()
    for name in ("both", PIN):
        assert fleet.worker(name, PIN)["indexed_blocks"] == 0, name
    headers, cached, _ = complete(fleet, PIN, tokens)
    assert (predicted(headers), cached) == (0, 0)


def test_every_scored_prediction_was_exact_but_the_one_caused_by_the_pin_salt(fleet) -> None:
    for name in fleet.gateways:
        for release in fleet.servers:
            if fleet.servers[release].url not in fleet.gateways[name].status():
                continue
            p = precision(fleet, name, release)
            expected_over = 1 if (name, release) == (PIN, PIN) else 0
            assert (p["over"], p["under"]) == (expected_over, 0), (name, release, p)


# -- restart --------------------------------------------------------------------------------------


def test_a_restarted_worker_is_detected_its_index_cleared_and_routing_exact_again(fleet) -> None:
    server = fleet.servers[LATEST]
    tokens = prompt(5, 3 * PAGE)
    complete(fleet, LATEST, tokens)
    headers, cached, _ = complete(fleet, LATEST, tokens)
    assert predicted(headers) == cached == 2 * PAGE
    gw = fleet.gateways[LATEST]
    before = gw.status()[server.url]
    server.restart()  # the same command on the same ports: the gateway knows it only by its URL

    def back() -> dict[str, Any] | None:
        w = gw.status()[server.url]
        return w if w["ladder"]["state"] == "READY" and w["ladder"]["attested_at"] > before["ladder"]["attested_at"] else None

    # Its /health failing is what the gateway notices (a restarted publisher's seq 0 arrives on a feed
    # the re-attestation made anew, so it counts no seq restart): the ladder runs again from the start.
    wait_until(back, "the restarted worker to be attested again", 120)
    fleet.settle()
    assert gw.status()[server.url]["indexed_blocks"] < before["indexed_blocks"]
    # The old pages are gone from the index as from the engine: predicted and reported 0, then a hit.
    headers, cached, _ = complete(fleet, LATEST, tokens)
    assert (predicted(headers), cached) == (0, 0)
    headers, cached, _ = complete(fleet, LATEST, tokens)
    assert predicted(headers) == cached == 2 * PAGE
    p = precision(fleet, LATEST, LATEST)
    assert p["over"] == p["under"] == 0, p
