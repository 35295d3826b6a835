"""What the gateway hands a chat template for a chat request, per SGLang release (cacheon.tokens.chat).

The template below prints every variable it is given as JSON, so each test reads exactly what a
release's ``serving_chat`` would pass ``apply_chat_template``; the real template and engine are in
tests/engines/test_real_chat.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cacheon.errors import UsageError
from cacheon.sim.tokenizer import BOS_TOKEN, write_profile
from cacheon.tokens.chat import ChatRefusal, NotPredictable
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

PIN, MIDDLE, LATEST = "0.5.13.post1", "0.5.19", "0.5.23"
SHOW = ("{{ {'messages': messages, 'tools': tools, 'documents': documents, 'gen': add_generation_prompt,"
        " 'effort': reasoning_effort | default('unset'), 'thinking': enable_thinking | default('unset'),"
        " 'mode': mode | default('unset'), 'bos': bos_token} | tojson }}")
PARTS = "{% for m in messages %}{% for c in m['content'] %}[{{ c['text'] }}]{% endfor %}{% endfor %}"
TOOL = {"type": "function", "function": {"parameters": {"type": "object"}, "name": "get_weather",
                                         "description": "<weather> & more"}}
ASK = {"role": "user", "content": "hi"}


def profile(tmp_path, template: str) -> TokenizerProfile:
    tokenizer, path = write_profile(tmp_path)
    path.write_text(template)
    return TokenizerProfile(TokenizerSpec(tokenizer=tokenizer, chat_template=path, bos_token=BOS_TOKEN))


def shown(tmp_path, body: dict[str, Any], release: str = PIN) -> dict[str, Any]:
    text, _ = profile(tmp_path, SHOW).render_chat(body, [release])
    return json.loads(text)


def refused(tmp_path, body: dict[str, Any], releases: list[str] | None = None) -> ChatRefusal:
    with pytest.raises(NotPredictable) as info:
        profile(tmp_path, SHOW).render_chat(body, releases or [PIN])
    return info.value.reason


def test_tools_are_passed_as_each_release_dumps_them(tmp_path) -> None:
    canonical = shown(tmp_path, {"messages": [ASK], "tools": [TOOL]})
    assert canonical["tools"] == [{"type": "function", "function": {
        "description": "<weather> & more", "name": "get_weather", "parameters": {"type": "object"},
        "strict": False}, "defer_loading": None}]
    assert list(canonical["tools"][0]["function"]) == ["description", "name", "parameters", "strict"]
    assert shown(tmp_path, {"messages": [ASK], "tools": [TOOL]}, MIDDLE)["tools"] == canonical["tools"]
    as_sent = shown(tmp_path, {"messages": [ASK], "tools": [TOOL]}, LATEST)["tools"][0]["function"]
    assert list(as_sent) == ["parameters", "name", "description"]  # the client's order, no strict injected
    text, _ = profile(tmp_path, SHOW).render_chat({"messages": [ASK], "tools": [TOOL]})
    assert "<weather> & more" in text  # transformers' tojson: no HTML escaping, keys unsorted
    assert shown(tmp_path, {"messages": [ASK]}) | {"tools": 0} == {
        "messages": [ASK], "tools": 0, "documents": None, "gen": True, "effort": "unset", "thinking": "unset",
        "mode": "unset", "bos": BOS_TOKEN}


def test_tool_choice_none_drops_the_tools_and_a_named_choice_keeps_only_that_one(tmp_path) -> None:
    other = {"type": "function", "function": {"name": "get_time"}}
    assert shown(tmp_path, {"messages": [ASK], "tools": [TOOL], "tool_choice": "none"})["tools"] is None
    named = shown(tmp_path, {"messages": [ASK], "tools": [TOOL, other],
                             "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert [t["function"]["name"] for t in named["tools"]] == ["get_time"]
    assert refused(tmp_path, {"messages": [ASK], "tools": [TOOL],
                              "tool_choice": {"type": "function", "function": {"name": "nope"}}}) \
        is ChatRefusal.ENGINE_REJECTS


def test_template_kwargs_and_reasoning_effort_merge_as_each_release_merges_them(tmp_path) -> None:
    body = {"messages": [ASK], "chat_template_kwargs": {"mode": "x", "enable_thinking": False}}
    assert (shown(tmp_path, body)["mode"], shown(tmp_path, body)["thinking"]) == ("x", False)
    high = {"messages": [ASK], "reasoning_effort": "high"}
    assert (shown(tmp_path, high)["effort"], shown(tmp_path, high)["thinking"]) == ("high", "unset")  # pin
    assert shown(tmp_path, high, MIDDLE)["thinking"] is True  # 0.5.19 on: any effort turns thinking on
    assert shown(tmp_path, {"messages": [ASK], "reasoning_effort": "none"})["thinking"] is False
    popped = shown(tmp_path, {"messages": [ASK], "chat_template_kwargs": {"reasoning_effort": "low"}})
    assert popped["effort"] == "low"
    assert refused(tmp_path, {"messages": [ASK], "reasoning": {"effort": "low"}}) is ChatRefusal.UNSUPPORTED_FIELD


def test_messages_are_dumped_parsed_and_flattened_as_sglang_does(tmp_path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    body = {"messages": [
        {"role": "System", "content": "s", "name": None},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]},
        {"role": "assistant", "content": "last"},
    ]}
    assert shown(tmp_path, body)["messages"] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a b"},  # string-format template: text parts joined; user's extras dropped
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "index": None, "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
        {"role": "user", "content": "last"},  # a final assistant message becomes the user's
    ]
    text, _ = profile(tmp_path, PARTS).render_chat({"messages": [body["messages"][1]]})
    assert text == "[a][b]"  # a template that iterates content gets the parts


def test_continue_final_message_appends_the_assistant_text_encoded_on_its_own(tmp_path) -> None:
    p = profile(tmp_path, "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}")
    body = {"messages": [ASK, {"role": "assistant", "content": "The cache"}], "continue_final_message": True}
    text, prefix = p.render_chat(body)
    assert (text, prefix) == (f"{BOS_TOKEN}<|user|>hi", "The cache")
    tail = p.tokenizer.encode("The cache").ids
    assert p.encode_chat(body) == [*p.windows.encode(text), *(tail[1:] if tail[0] == p.bos_id else tail)]


@pytest.mark.parametrize(("body", "reason"), [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     ChatRefusal.CONTENT_PARTS),
    ({"messages": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}, ChatRefusal.CONTENT_PARTS),
    ({"messages": [ASK], "input_ids": [1, 2]}, ChatRefusal.INPUT_IDS),
    ({"messages": [{"role": "system", "content": "s", "tools": [TOOL]}, ASK]}, ChatRefusal.UNSUPPORTED_FIELD),
    ({"messages": [ASK], "tools": [{**TOOL, "defer_loading": True}]}, ChatRefusal.UNSUPPORTED_FIELD),
    ({"messages": [ASK], "reasoning_effort": "xhigh"}, ChatRefusal.UNSUPPORTED_FIELD),
    ({"messages": [ASK], "chat_template_kwargs": {"continue_final_message": True}}, ChatRefusal.UNSUPPORTED_FIELD),
    ({"messages": [ASK], "chat_template_kwargs": {"add_generation_prompt": False}}, ChatRefusal.UNSUPPORTED_FIELD),
    ({"messages": [{"role": "user", "content": 5}]}, ChatRefusal.ENGINE_REJECTS),
    ({"messages": [ASK], "tools": [], "tool_choice": "required"}, ChatRefusal.ENGINE_REJECTS),
    ({"messages": [{"role": "robot", "content": "x"}]}, ChatRefusal.ENGINE_REJECTS),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "{not json"}}]}, ASK]}, ChatRefusal.ENGINE_REJECTS),
])
def test_what_is_not_reproduced_is_refused_with_a_reason(tmp_path, body, reason) -> None:
    assert refused(tmp_path, body) is reason


def test_releases_that_render_a_request_differently_are_refused_together(tmp_path) -> None:
    p = profile(tmp_path, SHOW)
    plain = {"messages": [ASK]}
    assert p.encode_chat(plain, [PIN, LATEST]) == p.encode_chat(plain, [PIN])
    assert p.encode_chat(plain, ["0.5.20"]) == p.encode_chat(plain, [PIN])  # unread, but every contract agrees
    tools = {"messages": [ASK], "tools": [TOOL]}
    assert refused(tmp_path, tools, [PIN, LATEST]) is ChatRefusal.RELEASES_DIFFER
    assert refused(tmp_path, tools, ["0.5.20"]) is ChatRefusal.RELEASE_UNREAD
    assert p.encode_chat(tools, [PIN, MIDDLE]) == p.encode_chat(tools, [PIN])
    by_name = profile(tmp_path, "{% for t in tools %}{{ t.function.name }}:{% endfor %}{{ messages[0].content }}")
    assert by_name.render_chat(tools, [PIN, LATEST, "0.5.20"])[0] == "get_weather:hi"  # the outputs agree


def test_a_template_that_reads_tool_call_ids_with_a_run_of_results_is_refused_on_0_5_23(tmp_path) -> None:
    p = profile(tmp_path, "{% for m in messages %}{{ m.tool_call_id }}{{ m.content }}{% endfor %}")
    calls = [{"id": i, "function": {"name": "f", "arguments": "{}"}} for i in ("a", "b")]
    body = {"messages": [ASK, {"role": "assistant", "content": "", "tool_calls": calls},
                         {"role": "tool", "tool_call_id": "b", "content": "2"},
                         {"role": "tool", "tool_call_id": "a", "content": "1"}]}
    assert p.render_chat(body, [PIN])[0] == "hib2a1"
    with pytest.raises(NotPredictable) as info:
        p.render_chat(body, [LATEST])
    assert info.value.reason is ChatRefusal.UNSUPPORTED_FIELD


def test_a_template_that_fails_on_wrapped_tools_gets_each_function_alone_as_sglang_retries(tmp_path) -> None:
    p = profile(tmp_path, "{% for t in tools %}{% if t.function is defined %}{{ raise_exception('flat only') }}"
                          "{% endif %}<{{ t.name }}>{% endfor %}{{ messages[0].content }}")
    assert p.render_chat({"messages": [ASK], "tools": [TOOL]})[0] == "<get_weather>hi"
    with pytest.raises(UsageError, match="flat only"):
        profile(tmp_path, "{{ raise_exception('flat only') }}").render_chat({"messages": [ASK], "tools": [TOOL]})
    with pytest.raises(UsageError, match="division"):  # any template error is a clear 400, never a traceback
        profile(tmp_path, "{{ 1 // 0 }}").render_chat({"messages": [ASK]})
