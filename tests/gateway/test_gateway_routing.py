"""Routing through a live gateway: approx's prefix tree, and pools that serve more than one model."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from cacheon.sim.launch import GatewayProcess, SimProcess
from cacheon.sim.tokenizer import gateway_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: workers and a gateway as processes

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly and cite the manual. " * 6}


def _chat(url: str, messages: list[dict[str, str]], model: str = "demo") -> httpx.Response:
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 3},
                   timeout=30)
    r.raise_for_status()
    return r


def test_approx_sends_a_conversation_back_to_the_worker_that_saw_it(tmp_path: Path,
                                                                    profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp_path, profile, "0.5.13.post1") for _ in range(3)]
        for s in sims:
            s.ready()
        gw = GatewayProcess(stack, tmp_path, profile, "approx", [{"url": s.url} for s in sims])
        history = [SYSTEM, {"role": "user", "content": "What is a radix cache?"}]
        first = _chat(gw.url, history)
        assert first.headers["x-cacheon-route"] == "approx:fallback_miss"
        reply = first.json()["choices"][0]["message"]["content"]
        for turn in range(3):  # the next turns re-send the history: same worker, a real cache hit there
            history = [*history, {"role": "assistant", "content": reply},
                       {"role": "user", "content": f"And question {turn}?"}]
            r = _chat(gw.url, history)
            assert r.headers["x-cacheon-route"] == "approx:prefix_hit"
            assert r.headers["x-cacheon-worker"] == first.headers["x-cacheon-worker"]
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            reply = r.json()["choices"][0]["message"]["content"]
        # A removed worker's tree entries go with it: its conversation falls back to the others.
        wid = next(w["id"] for w in gw.status().values() if w["url"] == first.headers["x-cacheon-worker"])
        assert httpx.delete(f"{gw.admin_url}/workers/{wid}", timeout=30).status_code == 200
        r = _chat(gw.url, history)
        assert r.headers["x-cacheon-worker"] != first.headers["x-cacheon-worker"]
        assert r.headers["x-cacheon-route"] == "approx:fallback_miss"


def test_requests_only_reach_workers_serving_their_model(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        demo, other = SimProcess(stack, tmp_path, profile, "0.5.13.post1"), SimProcess(stack, tmp_path, profile, "0.5.22",
                                                                         model="other")
        for s in (demo, other):
            s.ready()
        spec = gateway_model(*profile)
        gw = GatewayProcess(stack, tmp_path, profile, "rr", [{"url": demo.url}, {"url": other.url}],
                     models={"demo": spec, "other": spec})
        gw.wait_discovered([demo.url, other.url])
        for _ in range(4):  # round robin alone would alternate between the two workers
            assert _chat(gw.url, [SYSTEM], "other").headers["x-cacheon-worker"] == other.url
            assert _chat(gw.url, [SYSTEM], "demo").headers["x-cacheon-worker"] == demo.url
        unknown = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "nope", "messages": [SYSTEM]})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"

        # SGLang's native /generate has no model field: with two models the client must name one.
        native = {"text": SYSTEM["content"], "sampling_params": {"max_new_tokens": 2}}
        ambiguous = httpx.post(f"{gw.url}/generate", json=native, timeout=30)
        assert ambiguous.status_code == 400 and "name one in 'model'" in ambiguous.json()["error"]["message"]
        named = httpx.post(f"{gw.url}/generate", json={**native, "model": "other"}, timeout=30)
        assert named.status_code == 200 and named.headers["x-cacheon-worker"] == other.url
        assert named.json()["meta_info"]["prompt_tokens"] > 0
