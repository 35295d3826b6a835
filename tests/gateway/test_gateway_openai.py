"""The official openai client against a live gateway (real uvicorn) over simulated SGLang workers."""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from cacheon.sim.launch import GatewayProcess, SimProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: workers and a gateway as processes

LONG = "You are a helpful assistant. Answer briefly and cite the manual. " * 4


def test_openai_client_through_exact_gateway(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        # Two releases with different wires (tagged arrays vs tagged maps + topic replay framing).
        sims = [SimProcess(stack, tmp_path, profile, "0.5.13.post1"), SimProcess(stack, tmp_path, profile, "0.5.22")]
        for s in sims:
            s.ready()
        gw = GatewayProcess(stack, tmp_path, profile, "exact", [{"url": s.url} for s in sims])
        status = gw.settled([s.url for s in sims])
        assert {s["ladder"]["state"] for s in status.values()} == {"READY"}, status
        assert {s["contract"] for s in status.values()} == {"sglang-kv-rank-v1", "sglang-kv-rank-v4"}

        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", timeout=30, max_retries=0)
        indexed = {url: w["indexed_blocks"] for url, w in status.items()}
        raw = client.completions.with_raw_response.create(model="demo", prompt=LONG, max_tokens=5)
        done = raw.parse()
        assert raw.headers["x-cacheon-worker"] in {s.url for s in sims}
        assert raw.headers["x-cacheon-route"].startswith("exact:")
        assert done.choices[0].text.strip() and done.usage.completion_tokens == 5

        # Once its KV events are indexed, the same prefix goes back to the same worker. Probing before then
        # would be a miss that caches the longer probe elsewhere, and that worker would rightly win after.
        first = raw.headers["x-cacheon-worker"]
        wait_until(lambda: gw.status()[first]["indexed_blocks"] > indexed[first], "the prompt's KV events", 20)
        again = client.completions.with_raw_response.create(model="demo", prompt=LONG + " more", max_tokens=1)
        assert (again.headers["x-cacheon-route"], again.headers["x-cacheon-worker"]) == ("exact:prefix_hit", first)

        pieces = list(client.completions.create(model="demo", prompt="stream me", max_tokens=4, stream=True))
        assert len(pieces) == 4 and all(p.choices[0].text for p in pieces)

        messages = [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}]
        chat = client.chat.completions.with_raw_response.create(model="demo", messages=messages, max_tokens=3)
        assert chat.headers["x-cacheon-route"].startswith("exact:")
        assert chat.parse().choices[0].message.content
        deltas = [c.choices[0].delta.content for c in
                  client.chat.completions.create(model="demo", messages=messages, max_tokens=3, stream=True)]
        assert len(deltas) == 3 and all(deltas)

        # Chats render as each worker's release renders them (cacheon.tokens.chat): this template prints no
        # tools, so every release renders a tool chat alike, 0.5.22 (no chat contract) included: predicted.
        # An image part is the engine's to render: refused with the reason, whatever the worker answers.
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        chat_url = f"{gw.url}/v1/chat/completions"
        alike = httpx.post(chat_url, json={"model": "demo", "messages": messages, "tools": tools, "max_tokens": 1})
        assert alike.status_code == 200 and "x-cacheon-predicted-cached-tokens" in alike.headers
        image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]
        refused = httpx.post(chat_url, json={"model": "demo", "messages": image, "max_tokens": 1})
        assert refused.headers["x-cacheon-prediction-refused"] == "content_parts"

        assert [m.id for m in client.models.list()] == ["demo"]
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="x", max_tokens=1)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="demo", messages="not a list", max_tokens=1)  # type: ignore[arg-type]  # deliberately malformed

        native = httpx.post(f"{gw.url}/generate", json={"text": LONG, "sampling_params": {"max_new_tokens": 2}})
        assert native.status_code == 200 and native.headers["x-cacheon-route"].startswith("exact:")
        assert native.json()["meta_info"]["cached_tokens"] > 0

        metrics = httpx.get(f"{gw.url}/metrics").text
        assert 'cacheon_route_decisions_total{policy="exact",reason="prefix_hit"}' in metrics
        assert "cacheon_kv_batches_total" in metrics
        hits = re.search(r'cacheon_token_windows_total\{model="demo",outcome="hit"\} (\S+)', metrics)
        assert hits and float(hits.group(1)) > 0  # repeated prompts reuse their tokenized windows
        stems = re.search(r'cacheon_token_stems_total\{model="demo"\} (\S+)', metrics)
        assert stems and float(stems.group(1)) > 0  # the second chat request resumed from the first's stem
        assert "cacheon_prefix_hit_tokens_total" in metrics
        assert httpx.get(f"{gw.url}/health").status_code == 200

        # Draining stops new requests to a worker; removal also drops its KV state.
        wid = gw.status()[first]["id"]
        drained = httpx.post(f"{gw.admin_url}/workers/{wid}/drain", json={"deadline_s": 5}, timeout=10)
        assert drained.status_code == 200 and drained.json()["drained"] and drained.json()["draining"]
        assert {client.completions.with_raw_response.create(model="demo", prompt=LONG, max_tokens=1)
                .headers["x-cacheon-worker"] for _ in range(3)} == {s.url for s in sims} - {first}
        assert gw.status()[first]["indexed_blocks"] > 0
        assert httpx.delete(f"{gw.admin_url}/workers/{wid}", timeout=30).status_code == 200
        assert first not in gw.status()
        for _ in range(4):
            assert client.completions.with_raw_response.create(
                model="demo", prompt=LONG, max_tokens=1).headers["x-cacheon-worker"] != first
        bad = httpx.post(f"{gw.admin_url}/workers", json={"url": "ftp://x"}, timeout=10)
        assert bad.status_code == 400 and "is not http(s)://HOST:PORT" in bad.json()["error"]["message"]
        assert httpx.delete(f"{gw.admin_url}/workers/nobody", timeout=10).status_code == 404
        added = httpx.post(f"{gw.admin_url}/workers", json={"url": first}, timeout=10)
        assert added.status_code == 201, added.text
        again = gw.settled([first])[first]
        assert again["ladder"]["state"] == "READY", again["ladder"]
