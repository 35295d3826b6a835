"""Chats as real clients send them (tools, tool calls, template kwargs, efforts, content parts,
continue_final_message) against a real SGLang server on a real tokenizer and chat template.

The server (the pin) serves a tiny random model on Gemma 4's tokenizer and chat template
(scripts/make_real_vocab.py, from llama.cpp's vocab GGUF): a template that renders tool
declarations, tool calls and thinking. For each request the engine's own prompt ids
(``return_prompt_token_ids``) must equal the gateway profile's rendering, and through an ``exact``
gateway the predicted cached tokens must equal the engine's ``cached_tokens``. Rendering
``messages`` alone (what the gateway did before) misses the tool declarations: both fail then.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from cacheon.sim.launch import GatewayProcess
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec
from tests.engines.conftest import serve
from tests.engines.server import SERVED_MODEL_NAME, EngineServer, EngineSpec
from tests.engines.test_real_gateway import Fleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PIN = "0.5.13.post1"
# Llama, not Qwen2: transformers loads a qwen2 model's tokenizer as Qwen2Tokenizer, whatever its files say.
SPEC = EngineSpec(PIN, 16, "llama", vocab="gemma-4")
SYSTEM = {"role": "system", "content": "You answer weather questions for travellers. Use the tools you are given."}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}},
         {"type": "function", "function": {
             "name": "get_time", "description": "The local time in a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ASK = {"role": "user", "content": "What is the weather in Paris?"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 C, sunny"}]}


class Chat:
    def __init__(self, server: EngineServer, gateway: GatewayProcess, profile: TokenizerProfile) -> None:
        self.server, self.gateway, self.profile = server, gateway, profile
        self.fleet = Fleet({PIN: server}, {"chat": gateway})

    def send(self, body: dict[str, Any]) -> tuple[list[int], int, int]:
        """Through the gateway: the engine's prompt ids, its cached tokens, the gateway's prediction."""
        full = {"model": SERVED_MODEL_NAME, "max_tokens": 1, "temperature": 0, "return_prompt_token_ids": True,
                **body}
        response = httpx.post(f"{self.gateway.url}/v1/chat/completions", json=full, timeout=120)
        assert response.status_code == 200, response.text[:2000]
        done = response.json()
        self.fleet.settle()  # the next request's prediction sees this one's pages
        details = done["usage"].get("prompt_tokens_details") or {}
        predicted = response.headers.get("x-cacheon-predicted-cached-tokens")
        assert predicted is not None, dict(response.headers)
        return done["choices"][0]["prompt_token_ids"], details.get("cached_tokens", 0), int(predicted)


@pytest.fixture(scope="module")
def chat(engine_pool, tmp_path_factory):
    server = serve(engine_pool, SPEC)
    model_dir = Path(server.model["path"])
    with ExitStack() as stack:
        gateway = GatewayProcess(stack, tmp_path_factory.mktemp("chat-gateway"), None, "exact",
                                 [{"url": server.url}], models={SERVED_MODEL_NAME: {"tokenizer": str(model_dir)}},
                                 health_interval_s=1.0, challenge_timeout_s=30, request_timeout_s=120)
        ladder = gateway.settled([server.url])[server.url]["ladder"]
        assert ladder["state"] == "READY", (ladder, gateway.log.read_text()[-3000:])
        yield Chat(server, gateway, TokenizerProfile(TokenizerSpec(tokenizer=model_dir)))


def test_a_tool_conversation_renders_as_the_engine_does_and_its_prefix_is_predicted(chat) -> None:
    first = {"messages": [SYSTEM, ASK], "tools": TOOLS}
    ids, _, _ = chat.send(first)
    assert ids == chat.profile.encode_chat(first, [PIN])
    assert "get_weather" in chat.profile.tokenizer.decode(ids)  # the declarations are in the prompt
    turn = {"messages": [SYSTEM, ASK, CALLED, RESULT, {"role": "user", "content": "And in Lyon?"}], "tools": TOOLS}
    ids, cached, predicted = chat.send(turn)
    assert ids == chat.profile.encode_chat(turn, [PIN])
    assert predicted == cached > 0


@pytest.mark.parametrize("extra", [
    {"tool_choice": "none"},  # tools dropped from the rendering
    {"chat_template_kwargs": {"enable_thinking": True}},
    {"reasoning_effort": "none"},
    {"messages": [SYSTEM, ASK, {"role": "assistant", "content": "In Paris it is"}], "continue_final_message": True},
    {"messages": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Weather"},
                                                       {"type": "text", "text": "in Paris?"}]}]},
], ids=["tool_choice_none", "enable_thinking", "effort_none", "continue_final", "text_parts"])
def test_each_field_sglang_renders_is_rendered_alike_and_predicted(chat, extra) -> None:
    """A named or required tool_choice is left to tests/tokens/test_chat.py: its grammar constraint
    (xgrammar) kills a CPU server's scheduler ("Unsupported device: cpu")."""
    body = {"messages": [SYSTEM, ASK], "tools": TOOLS, **extra}
    ids, cached, predicted = chat.send(body)
    assert ids == chat.profile.encode_chat(body, [PIN])
    assert predicted == cached
