"""A chat request turned into what SGLang's chat path hands its chat template, per release.

SGLang's OpenAI chat path (``serving_chat._apply_jinja_template``, read in each release below)
does not render ``messages`` alone: it passes ``tools`` (unless ``tool_choice`` is ``"none"``; a
named choice keeps that one tool), ``reasoning_effort`` and ``chat_template_kwargs`` as template
variables, flattens content parts, parses tool-call arguments, and treats a final assistant message
specially (``continue_final_message``: its text is appended after the rendering, encoded on its
own; otherwise it becomes a user message). A prediction from a rendering that left any of this out
is wrong, so whatever this module cannot reproduce exactly it refuses with a ``ChatRefusal``.

What differs per release is a ``ChatContract``: how a tool definition is dumped (the pin and 0.5.19
inject ``strict: false`` in their field order; 0.5.23 keeps the client's keys and order), whether
any ``reasoning_effort`` or only ``"none"`` sets ``thinking``/``enable_thinking``, and whether tool
results may be reordered by ``tool_call_id`` (0.5.23). A release no contract covers is refused
wherever the contracts disagree.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import jinja2
import jinja2.nodes as nodes

PIN = "0.5.13.post1"
T = TypeVar("T")


class ChatRefusal(StrEnum):
    """Why a chat request's tokens are not predicted (the gateway's refusal reasons)."""

    CONTENT_PARTS = "content_parts"  # media or typed parts other than text: rendered by the engine's processor
    INPUT_IDS = "chat_input_ids"  # the engine skips the template for these; not a chat rendering
    UNSUPPORTED_FIELD = "chat_unsupported_field"  # a field SGLang renders that is not reproduced here
    ENGINE_REJECTS = "chat_engine_rejects"  # a request the engine answers 400: nothing is cached
    RELEASE_UNREAD = "chat_release_unread"  # a worker release whose chat path was not read, where it matters
    RELEASES_DIFFER = "chat_releases_differ"  # the model's workers render this request differently


class NotPredictable(Exception):
    """This request's rendering cannot be reproduced exactly."""

    def __init__(self, reason: ChatRefusal, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class ToolDump(StrEnum):
    """How a release's ``Tool.model_dump()`` writes a tool definition for the template."""

    CANONICAL = "canonical"  # {type, function: {description, name, parameters, strict=false}, defer_loading}
    AS_SENT = "as-sent"  # function keys in the client's order, strict only when sent


class ThinkingDefault(StrEnum):
    """Which ``reasoning_effort`` values set ``thinking``/``enable_thinking`` (setdefault) in the kwargs."""

    NONE_ONLY = "none-only"  # "none" sets both False; other efforts set nothing
    ANY_EFFORT = "any-effort"  # "none" sets both False, any other effort sets both True


@dataclass(frozen=True)
class ChatContract:
    """One release family's chat rendering, read off its ``serving_chat.py`` and ``protocol.py``."""

    id: str
    versions: tuple[str, ...]
    tool_dump: ToolDump
    thinking: ThinkingDefault
    # Templates that read tool_call_id get tool-result runs sorted into tool_calls order first.
    reorders_tool_results: bool


CHAT_CONTRACTS: tuple[ChatContract, ...] = (
    ChatContract("sglang-chat-v1", (PIN,), ToolDump.CANONICAL, ThinkingDefault.NONE_ONLY, False),
    ChatContract("sglang-chat-v2", ("0.5.19",), ToolDump.CANONICAL, ThinkingDefault.ANY_EFFORT, False),
    ChatContract("sglang-chat-v3", ("0.5.23",), ToolDump.AS_SENT, ThinkingDefault.ANY_EFFORT, True),
)


def chat_contract(version: str) -> ChatContract | None:
    return next((c for c in CHAT_CONTRACTS if version in c.versions), None)


@dataclass(frozen=True)
class Rendering:
    """What ``apply_chat_template`` is called with, and the text appended after it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    kwargs: dict[str, Any]
    assistant_prefix: str | None


class ContentFormat(StrEnum):
    """SGLang's reading of a template: does it iterate content parts (``openai``) or print a string?"""

    STRING = "string"
    OPENAI = "openai"


def _reads(node: nodes.Node, names: tuple[str, ...]) -> bool:
    """Whether ``node`` is ``<name>.content`` / ``<name>['content']`` under filters, tests or a slice."""
    if isinstance(node, nodes.Filter | nodes.Test) and node.node is not None:
        return _reads(node.node, names)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, names)
    key = (node.attr if isinstance(node, nodes.Getattr) else
           node.arg.value if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) else None)
    inner = getattr(node, "node", None)
    return key == "content" and isinstance(inner, nodes.Name) and inner.name in names


def content_format(source: str, env: jinja2.Environment) -> ContentFormat:
    """As SGLang's ``detect_jinja_template_content_format`` (the same in every contract's release)."""
    if any(word in source for word in ("image", "audio", "video", "vision")):
        return ContentFormat.OPENAI
    try:
        tree = env.parse(source)
    except jinja2.TemplateError:
        return ContentFormat.STRING
    loops = tree.find_all(nodes.For)
    return ContentFormat.OPENAI if any(_reads(loop.iter, ("message", "msg", "m")) for loop in loops) \
        else ContentFormat.STRING


def reads_tool_call_id(source: str) -> bool:
    """An over-approximation of 0.5.23's ``jinja_template_may_reorder_tool_results``: any mention."""
    return "tool_call_id" in source


_GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder")
# What SGLang's message types dump besides role and content (pydantic field order); None is dropped.
_GENERIC_FIELDS = ("tool_call_id", "name", "reasoning_content", "tool_calls")
_REASONING_EFFORTS = ("none", "low", "medium", "high", "max")  # every contract's release accepts these
# apply_chat_template's own parameters (transformers 5.8-5.19): SGLang spreads chat_template_kwargs into
# its call, so these keys change how it renders (or fail it) instead of becoming template variables.
_TEMPLATE_CALL_PARAMETERS = frozenset((
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"))


def _refuse(reason: ChatRefusal, detail: str) -> NotPredictable:
    return NotPredictable(reason, detail)


def _text_parts(content: list[Any], where: str) -> list[str]:
    texts = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise _refuse(ChatRefusal.CONTENT_PARTS, f"{where} has a {kind!r} part (only text parts are rendered here)")
        texts.append(part["text"])
    return texts


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """``ToolCall.model_dump()``, arguments parsed from JSON as every release does before rendering."""
    if not isinstance(calls, list):
        raise _refuse(ChatRefusal.ENGINE_REJECTS, f"{where}.tool_calls must be a list")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise _refuse(ChatRefusal.ENGINE_REJECTS, f"{where}.tool_calls[{i}] has no function object")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                raise _refuse(ChatRefusal.ENGINE_REJECTS, f"{where}.tool_calls[{i}] arguments are not JSON") from None
        out.append({"id": call.get("id"), "index": call.get("index"), "type": call.get("type", "function"),
                    "function": {"name": function.get("name"), "arguments": arguments}})
    return out


_PLAIN_ROLES = frozenset(("user", "system", "assistant"))
_PLAIN_KEYS = frozenset(("role", "content"))


def _message(m: Mapping[str, Any], i: int, fmt: ContentFormat) -> dict[str, Any]:
    """One message as SGLang hands it to the template: dumped, None dropped, parts flattened."""
    role, content = m.get("role"), m.get("content")
    if role in _PLAIN_ROLES and content.__class__ is str:  # most of a history: nothing to dump, drop or flatten
        if m.keys() <= _PLAIN_KEYS:
            return m  # type: ignore[return-value]  # as is: the sandboxed template cannot change it
        if role == "user":
            return {"role": role, "content": content}
    where = f"messages[{i}]"
    if not isinstance(role, str):
        raise _refuse(ChatRefusal.ENGINE_REJECTS, f"{where} has no string role")
    if role != "user":
        role = role.lower()
        if role not in _GENERIC_ROLES:
            raise _refuse(ChatRefusal.ENGINE_REJECTS, f"{where} role {role!r} is not one SGLang accepts")
    for field in ("tools", "prefix", "phase"):
        if m.get(field) is not None:
            raise _refuse(ChatRefusal.UNSUPPORTED_FIELD, f"{where}.{field} is rendered per model, not reproduced")
    if role == "user" and content is None:
        raise _refuse(ChatRefusal.ENGINE_REJECTS, f"{where} is a user message without content")
    if content is None:
        content = ""
    if isinstance(content, list):
        texts = _text_parts(content, where)
        if fmt is ContentFormat.STRING or role == "tool":
            content = " ".join(texts)
        else:
            content = [{"type": "text", "text": t} for t in texts]
    elif not isinstance(content, str):
        raise _refuse(ChatRefusal.ENGINE_REJECTS, f"{where}.content must be a string or a list of parts")
    out: dict[str, Any] = {"role": role, "content": content}
    if role == "user":  # the user message type has no other fields: the rest is ignored
        return out
    for field in _GENERIC_FIELDS:
        value = m.get(field)
        if value is not None:
            out[field] = _tool_calls(value, where) if field == "tool_calls" else value
    return out


def _tool(tool: Any, i: int, dump: ToolDump) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _refuse(ChatRefusal.ENGINE_REJECTS, f"tools[{i}] needs a function with a string name")
    if tool.get("defer_loading") is not None or function.get("defer_loading") is not None:
        raise _refuse(ChatRefusal.UNSUPPORTED_FIELD, f"tools[{i}] uses defer_loading")
    known = {"description": function.get("description"), "name": function["name"],
             "parameters": function.get("parameters")}
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _refuse(ChatRefusal.UNSUPPORTED_FIELD, f"tools[{i}].function.strict is not a boolean")
    if dump is ToolDump.CANONICAL:
        body = {**known, "strict": bool(strict)}
    else:
        body = dict(known)
        if strict is not None:
            body["strict"] = strict
        order = [k for k in function if k in body]
        body = {k: body[k] for k in order + [k for k in body if k not in order]}
    return {"type": tool.get("type", "function"), "function": body, "defer_loading": None}


def _tools(body: Mapping[str, Any], contract: ChatContract) -> list[dict[str, Any]] | None:
    """The tools the template sees: none for ``tool_choice: "none"``, one for a named choice."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice is None:
        choice = "auto" if tools is not None else "none"
    if tools is not None and not isinstance(tools, list):
        raise _refuse(ChatRefusal.ENGINE_REJECTS, "tools must be a list")
    if isinstance(choice, str):
        if choice not in ("auto", "required", "none"):
            raise _refuse(ChatRefusal.ENGINE_REJECTS, f"tool_choice {choice!r} is not auto, required or none")
        if choice == "required" and not tools:
            raise _refuse(ChatRefusal.ENGINE_REJECTS, "tool_choice 'required' without tools")
        if not tools or choice == "none":
            return None
        return [_tool(t, i, contract.tool_dump) for i, t in enumerate(tools)]
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    dumped = [_tool(t, i, contract.tool_dump) for i, t in enumerate(tools or [])]
    chosen = [t for t in dumped if t["function"]["name"] == name]
    if not chosen:
        raise _refuse(ChatRefusal.ENGINE_REJECTS, f"tool_choice names {name!r}, which is not in tools")
    return chosen


def _kwargs(body: Mapping[str, Any], contract: ChatContract) -> dict[str, Any]:
    """``reasoning_effort`` then ``chat_template_kwargs``, merged as the request validator and
    ``_convert_to_internal_request`` leave them."""
    if body.get("reasoning") is not None:
        raise _refuse(ChatRefusal.UNSUPPORTED_FIELD, "the 'reasoning' object is not reproduced; send reasoning_effort")
    given = body.get("chat_template_kwargs")
    if given is not None and not isinstance(given, dict):
        raise _refuse(ChatRefusal.ENGINE_REJECTS, "chat_template_kwargs must be an object")
    kwargs = dict(given or {})
    if clash := sorted(_TEMPLATE_CALL_PARAMETERS & kwargs.keys()):
        raise _refuse(ChatRefusal.UNSUPPORTED_FIELD, f"chat_template_kwargs {', '.join(clash)} are parameters of "
                      "apply_chat_template, not template variables")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in _REASONING_EFFORTS:
        raise _refuse(ChatRefusal.UNSUPPORTED_FIELD, f"reasoning_effort {effort!r} is not one of {_REASONING_EFFORTS}")
    if effort == "none" or (effort is not None and contract.thinking is ThinkingDefault.ANY_EFFORT):
        kwargs.setdefault("thinking", effort != "none")
        kwargs.setdefault("enable_thinking", effort != "none")
    popped = kwargs.pop("reasoning_effort", None)  # the internal request takes it over (after the validator)
    effort = popped if popped is not None else effort
    return {"reasoning_effort": effort, **kwargs} if effort is not None else kwargs


def _tool_runs_may_reorder(messages: list[dict[str, Any]]) -> bool:
    """Whether an assistant's tool calls are followed by two or more tool results (a run to sort)."""
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m.get("tool_calls"):
            run = itertools.takewhile(lambda n: n["role"] in ("tool", "function"), messages[i + 1:])
            if sum(1 for _ in run) > 1:
                return True
    return False


def render_request(body: Mapping[str, Any], contract: ChatContract, fmt: ContentFormat,
                   reads_ids: bool) -> Rendering:
    """What ``contract``'s release passes to ``apply_chat_template`` for ``body``."""
    if body.get("input_ids") is not None:
        raise _refuse(ChatRefusal.INPUT_IDS, "the engine serves input_ids without rendering messages")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _refuse(ChatRefusal.ENGINE_REJECTS, "messages must be a non-empty list")
    messages = [_message(m if isinstance(m, dict) else {}, i, fmt) for i, m in enumerate(raw)]
    if contract.reorders_tool_results and reads_ids and _tool_runs_may_reorder(messages):
        raise _refuse(ChatRefusal.UNSUPPORTED_FIELD, "this release may reorder tool results by tool_call_id")
    prefix = None
    last = messages[-1]
    if last["role"] == "assistant" and isinstance(last["content"], str):
        if body.get("continue_final_message") is True:
            prefix, messages = last["content"], messages[:-1]
        else:  # SGLang keeps the last message a user's
            messages[-1] = {"role": "user", "content": last["content"]}
    return Rendering(messages, _tools(body, contract), _kwargs(body, contract), prefix)


def rendered(body: Mapping[str, Any], releases: Iterable[str], fmt: ContentFormat, reads_ids: bool,
             render: Callable[[Rendering], T]) -> T:
    """``render`` of what every worker release passes the template for ``body``: the one output they
    share, refused where the outputs differ (every contract's counts for a release none covers).

    Templates that read tool fields by name render the releases' tool dumps alike, so the outputs are
    compared, not the inputs; each distinct input is rendered once."""
    given = set(releases) or {PIN}
    unread = sorted(v for v in given if chat_contract(v) is None)
    contracts = CHAT_CONTRACTS if unread else tuple(c for c in CHAT_CONTRACTS if given & set(c.versions))
    if len(contracts) == 1:  # the common fleet: one release, nothing to compare
        return render(render_request(body, contracts[0], fmt, reads_ids))
    by_input: dict[str, T] = {}
    for contract in contracts:
        r = render_request(body, contract, fmt, reads_ids)
        key = repr(r)
        if key not in by_input:
            by_input[key] = render(r)
    outputs = set(by_input.values())
    if len(outputs) > 1 and unread:
        raise _refuse(ChatRefusal.RELEASE_UNREAD, f"SGLang {', '.join(unread)} has no chat contract and the "
                      "read releases render this request differently")
    if len(outputs) > 1:
        raise _refuse(ChatRefusal.RELEASES_DIFFER, f"the workers' releases ({', '.join(sorted(given))}) render "
                      "this request differently")
    return outputs.pop()
