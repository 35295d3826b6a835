"""The simulator answers as a real SGLang server does where the two were compared (issue 17): the
reuse caps in ``cached_tokens``, ``data_parallel_rank``, and a 400 for a chat it cannot template."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from cacheon.sim.worker import SimSettings, SimWorker, build_app
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

PAGE = 4
PROMPT = list(range(10, 10 + 3 * PAGE))  # exactly three pages


@pytest.fixture
def sim(profile: tuple[Path, Path]) -> tuple[SimWorker, TestClient]:
    settings = SimSettings("demo", "0.5.23", PAGE, dp_size=2, kv_port=1, capacity_tokens=1 << 12)
    worker = SimWorker(settings, TokenizerProfile(TokenizerSpec(profile[0], profile[1], bos_token="<s>")), None)
    return worker, TestClient(build_app(worker))


def _cached(client: TestClient, **body: object) -> int:
    r = client.post("/v1/completions", json={"model": "demo", "prompt": PROMPT, "max_tokens": 1,
                                             "data_parallel_rank": 0, **body})
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_cached_tokens_carry_the_engines_caps(sim: tuple[SimWorker, TestClient]) -> None:
    _, client = sim
    assert _cached(client) == 0
    assert _cached(client) == 2 * PAGE  # an identical repeat: len - 1, floored to a page
    assert _cached(client, prompt=[*PROMPT, 1]) == 3 * PAGE  # control: one token more reuses all three
    assert _cached(client, echo=True, logprobs=1) == 0  # prompt logprobs from token 0
    assert _cached(client, echo=True) == 2 * PAGE
    native = client.post("/generate", json={"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": 5,
                                            "data_parallel_rank": 0, "sampling_params": {"max_new_tokens": 1}})
    assert native.json()["meta_info"]["cached_tokens"] == PAGE


def test_data_parallel_rank_picks_the_ranks_cache(sim: tuple[SimWorker, TestClient]) -> None:
    worker, client = sim
    _cached(client)
    assert _cached(client, data_parallel_rank=1) == 0  # rank 1's cache has not seen it
    assert _cached(client, data_parallel_rank=0) == 2 * PAGE
    assert [c.match(PROMPT) for c in worker.caches] == [3 * PAGE, 3 * PAGE]
    bad = client.post("/v1/completions", json={"model": "demo", "prompt": PROMPT, "data_parallel_rank": 2})
    assert bad.status_code == 400 and "data_parallel_rank" in bad.text


def test_a_chat_the_template_rejects_is_a_400_not_a_traceback(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    template = tmp_path / "strict.jinja"
    template.write_text("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
                        "{{ messages[0]['content'] }}")
    settings = SimSettings("demo", "0.5.23", PAGE, dp_size=1, kv_port=1, capacity_tokens=1 << 12)
    client = TestClient(build_app(SimWorker(settings, TokenizerProfile(TokenizerSpec(profile[0], template)), None)))
    ok = client.post("/v1/chat/completions", json={"model": "demo", "messages": [{"role": "user", "content": "x"}]})
    assert ok.status_code == 200  # control: a chat the template renders
    for path in ("/v1/chat/completions", "/v1/tokenize"):
        r = client.post(path, json={"model": "demo", "messages": [{"role": "tool", "content": "x"}]})
        assert r.status_code == 400, (path, r.text)
        assert "user first" in r.json()["message"]
