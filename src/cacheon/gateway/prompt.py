"""Request decoding: a route's body into its msgspec Struct, checked and bounded, as one ``Prompt``.

Only the fields the gateway reads are typed (one Struct per route, so their nesting is fixed); the
decoder skips the rest, and the body is forwarded as it came (``/generate`` less its ``model``).
Nesting past the decoder's recursion bound, in any field, and past ``MAX_DEPTH`` in the chat
messages it reads, is a 400. Token ids are bounded under every policy: one at or past the model's
vocabulary (or u32 without one) crashes SGLang's scheduler. A prompt is bounded by the served
model's context length (``max_model_len`` from discovery) before it is tokenized, by its length in
characters against the vocabulary's longest token, and after, by its tokens.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

from cacheon.errors import UsageError
from cacheon.gateway.prediction import NoPrediction, Reuse
from cacheon.gateway.refusals import Refusal, Rejected, bad, clip
from cacheon.gateway.workers import Discovery
from cacheon.tokens.chat import PIN
from cacheon.tokens.profile import TokenizerProfile

U32_IDS = 1 << 32  # no vocabulary reaches it
MAX_DEPTH = 32  # nesting of the chat messages the gateway decodes: far past any content part


class Route(StrEnum):
    """Which request shape a route takes, and where its engine reports cached tokens."""

    COMPLETION = "completion"
    CHAT = "chat"
    GENERATE = "generate"


class _Request(msgspec.Struct):
    """What every route's body has that the gateway reads; the namespace fields stay untyped, as
    the engine's own rule for them (``reuse_of``) is on their truthiness."""

    model: str | None = None
    stream: bool = False
    extra_key: Any = None
    lora_path: Any = None
    cache_salt: Any = None


class Completion(_Request):
    prompt: str | list[str | int | list[int]] | None = None
    echo: Any = None
    logprobs: Any = None


class Chat(_Request):
    """The fields SGLang's chat path hands its template (``tokens.chat`` reads and checks them)."""

    messages: list[dict[str, Any]] | None = None
    tools: Any = None
    tool_choice: Any = None
    chat_template_kwargs: Any = None
    reasoning_effort: Any = None
    reasoning: Any = None
    continue_final_message: Any = None
    input_ids: Any = None

    def rendered_fields(self) -> dict[str, Any]:
        """What the chat rendering reads, as the request mapping ``tokens.chat`` takes."""
        return {f: getattr(self, f) for f in _CHAT_FIELDS}


_CHAT_FIELDS = ("messages", "tools", "tool_choice", "chat_template_kwargs", "reasoning_effort", "reasoning",
                "continue_final_message", "input_ids")


class Generate(_Request):
    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None
    return_logprob: Any = None
    logprob_start_len: Any = None


Request = Completion | Chat | Generate
_DECODERS: dict[Route, msgspec.json.Decoder[Request]] = {
    Route.COMPLETION: msgspec.json.Decoder(Completion), Route.CHAT: msgspec.json.Decoder(Chat),
    Route.GENERATE: msgspec.json.Decoder(Generate)}
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_json = msgspec.json.Encoder()
_MUST = {"model": "a string", "stream": "a boolean", "messages": "a list of messages",
         "prompt": "a string, a list of strings, a list of token ids or a list of lists of token ids",
         "text": "a string or a list of strings", "input_ids": "a list of token ids or a list of lists of them"}
_GOT = {"int": "a number", "float": "a number", "str": "a string", "array": "an array", "object": "an object",
        "null": "null", "bool": "a boolean"}
_ERROR = re.compile(r"Expected `[^`]*`, got `(\w+)`(?: - at `\$(?:\.(\w+))?(\[\d+\])?[^`]*`)?")


@dataclass(frozen=True, slots=True)
class Prompt:
    """One decoded request: what is forwarded, and the one prompt in it the gateway may tokenize."""

    route: Route
    request: Request
    raw: bytes  # the body forwarded to the worker
    model: str | None  # the served model (None: no profiles, any model goes)
    context: int | None  # the model's context length in tokens, as its workers report it
    text: str | None = None  # a single prompt as text (tokenized with the route's rule)
    ids: list[int] | None = None  # a single prompt as token ids (checked against the vocabulary)
    chat: dict[str, Any] | None = None  # a chat request's rendered fields (``Chat.rendered_fields``)

    @property
    def chars(self) -> int:
        """Characters the gateway would tokenize (what decides whether that runs off the event loop)."""
        if self.text is not None:
            return len(self.text)
        return sum(map(len, _chat_texts(self.chat)))


def decode(route: Route, raw: bytes) -> Request:
    """The body as its route's Struct, or Rejected saying what is wrong with it."""
    try:
        return _DECODERS[route].decode(raw)
    except msgspec.ValidationError as exc:
        raise bad(_invalid(str(exc))) from None
    except msgspec.DecodeError:
        raise Rejected(Refusal.BAD_JSON, 400, "the request body is not valid JSON"
                       if raw.strip() else "the request body is empty: send a JSON object") from None
    except RecursionError:
        raise bad("the request body is nested too deeply") from None


def prompt_of(route: Route, request: Request, raw: bytes, profiles: Mapping[str, TokenizerProfile],
              discovered: Iterable[Discovery | None]) -> Prompt:
    """The decoded request as a ``Prompt`` for a served model, bounded; or Rejected."""
    found = list(discovered)
    model = _model(route, request.model, profiles, found)
    if isinstance(request, Generate) and request.model is not None:
        fields = _FIELDS.decode(raw)
        del fields["model"]
        raw = _json.encode(fields)
    context = max((d.max_model_len for d in found if d is not None and d.max_model_len
                   and (model is None or d.model == model)), default=None)
    profile = profiles.get(model) if model is not None else None
    prompt = Prompt(route, request, raw, model, context, **_single(request))
    for ids in _all_ids(request):
        _check_ids(ids, profile.vocab_size if profile is not None else None, context)
    if context is not None and profile is not None:
        longest = _longest_token(profile)
        for text in _all_texts(request, prompt):
            if len(text) > context * longest:
                raise Rejected(Refusal.CONTEXT_TOO_LONG, 400, f"the prompt ({len(text)} characters) cannot fit the "
                               f"model's context of {context} tokens", code="context_length_exceeded")
    return prompt


def encode(prompt: Prompt, profile: TokenizerProfile, releases: Iterable[str] = (PIN,)) -> list[int] | None:
    """The prompt's tokens as workers of ``releases`` will see them; None when it carries no single
    prompt. A chat template's error is Rejected (the engine answers 400 for it too); a chat rendering
    that cannot be reproduced raises ``NotPredictable``."""
    try:
        if prompt.chat is not None:
            return profile.encode_chat(prompt.chat, releases)
        if prompt.text is not None:
            return profile.encode(prompt.text) if prompt.route == Route.GENERATE else (
                profile.encode_completion(prompt.text))
    except UsageError as exc:
        raise bad(str(exc)) from None
    return prompt.ids


def reuse_of(request: Request, prompt_tokens: int) -> Reuse:
    """The engine's reuse cap and namespace for a request of ``prompt_tokens`` tokens."""
    if request.extra_key or request.lora_path:
        return Reuse(0, refusal=NoPrediction.NAMESPACE_NOT_PUBLISHED)
    salt = request.cache_salt or None  # SGLang ignores an empty salt
    if salt is not None and not isinstance(salt, str):
        return Reuse(0, refusal=NoPrediction.NAMESPACE_NOT_PUBLISHED)
    limit = prompt_tokens - 1
    start = _logprob_start(request)
    if start is not None:
        limit = min(limit, start)
    return Reuse(max(limit, 0), salt)


def _logprob_start(request: Request) -> int | None:
    """Where the request's prompt logprobs start, if it asks for them (SGLang's serving layer:
    an ``echo`` completion with ``logprobs`` asks from 0; native requests say so themselves)."""
    if isinstance(request, Completion):
        return 0 if request.echo and request.logprobs else None
    if isinstance(request, Generate) and request.return_logprob is True:
        start = request.logprob_start_len
        return start if type(start) is int and start >= 0 else None
    return None


def within_context(tokens: int, context: int | None) -> None:
    """Rejected when a tokenized prompt is longer than the model's context."""
    if context is not None and tokens > context:
        raise Rejected(Refusal.CONTEXT_TOO_LONG, 400, f"the prompt is {tokens} tokens, longer than the model's "
                       f"context of {context} tokens", code="context_length_exceeded")


def _model(route: Route, model: str | None, profiles: Mapping[str, TokenizerProfile],
           found: list[Discovery | None]) -> str | None:
    """The served model a request is for, or Rejected. SGLang's native ``/generate`` has no ``model``:
    with one configured model it is that one; with several the client names one (removed before
    forwarding). Without profiles, a model no discovered worker serves is unknown once every worker
    is discovered (before then it may be one still being asked)."""
    if route == Route.GENERATE and model is None:
        if len(profiles) > 1:
            raise bad(f"several models are served ({', '.join(profiles)}): name one in 'model'")
        return next(iter(profiles), None)
    if model is None:
        raise bad("'model' is required")
    known = set(profiles) or ({d.model for d in found if d is not None} if found and None not in found else None)
    if known is not None and model not in known:
        raise Rejected(Refusal.UNKNOWN_MODEL, 404, f"The model '{clip(model)}' does not exist",
                       code="model_not_found")
    return model if profiles else None


def _single(request: Request) -> dict[str, Any]:
    """The one prompt a request carries, if it carries one (batched prompts are not predicted)."""
    if isinstance(request, Chat):
        messages = request.messages
        if messages is None:
            raise bad("'messages' must be a list of messages, got null")
        for i, m in enumerate(messages):
            if not isinstance(m.get("role"), str):
                raise bad(f"messages[{i}] must be an object with a string 'role'")
        chat = request.rendered_fields()
        if not _within_depth([v for v in chat.values() if v is not None], MAX_DEPTH):
            raise bad(f"the chat request's fields are nested more than {MAX_DEPTH} deep")
        return {"chat": chat}
    prompt = request.prompt if isinstance(request, Completion) else (
        request.input_ids if request.input_ids is not None else request.text)
    if isinstance(prompt, str):
        return {"text": prompt}
    if prompt is None:
        return {}
    if all(type(t) is int for t in prompt):
        return {"ids": prompt}
    if not (all(isinstance(t, str) for t in prompt) or all(isinstance(t, list) for t in prompt)):
        what = "prompt" if isinstance(request, Completion) else "input_ids"
        raise bad(f"'{what}' must be {_MUST[what]}, not a mix")
    return {}


def _all_ids(request: Request) -> Iterable[list[int]]:
    """Every token-id prompt in the request, batched ones included."""
    prompt = request.prompt if isinstance(request, Completion) else (
        request.input_ids if isinstance(request, Generate) else None)
    if not isinstance(prompt, list):
        return
    ints = [t for t in prompt if type(t) is int]
    if ints:
        yield ints
    for t in prompt:
        if isinstance(t, list):
            yield t


def _all_texts(request: Request, prompt: Prompt) -> Iterable[str]:
    """Every text prompt in the request (a chat's: its contents together)."""
    if isinstance(request, Chat):
        yield "".join(_chat_texts(prompt.chat))
        return
    texts = request.prompt if isinstance(request, Completion) else request.text
    if isinstance(texts, str):
        yield texts
    elif isinstance(texts, list):
        yield from (t for t in texts if isinstance(t, str))


def _chat_texts(chat: Mapping[str, Any] | None) -> Iterable[str]:
    """The text a chat's messages carry: string contents and text parts (what bounds its tokens)."""
    for m in (chat or {}).get("messages") or ():
        content = m.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            yield from (p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


def _check_ids(ids: list[int], vocab_size: int | None, context: int | None) -> None:
    bound = vocab_size or U32_IDS
    if ids and (min(ids) < 0 or max(ids) >= bound):
        worst = next(t for t in ids if not 0 <= t < bound)
        where = f"the model's vocabulary [0, {vocab_size})" if vocab_size else "[0, 2**32)"
        raise bad(f"prompt token id {clip(str(worst), 32)} is outside {where}")
    within_context(len(ids), context)


@functools.cache
def _longest_token(profile: TokenizerProfile) -> int:
    """Characters in the vocabulary's longest token: a prompt has at least len(text) / this many tokens
    (a byte-level token's characters are its bytes, each at most one character of text)."""
    return max(map(len, profile.tokenizer.get_vocab(with_added_tokens=True)), default=1) or 1


def _within_depth(value: Any, limit: int) -> bool:
    """Whether no container in ``value`` sits more than ``limit`` containers deep (without recursing)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return False
                stack.append((child, depth + 1))
    return True


def _invalid(error: str) -> str:
    """msgspec's validation error as the client's field and what it must be."""
    match = _ERROR.match(error)
    if match is None:
        return f"invalid request: {error}"
    got, name, index = match.groups()
    got = _GOT.get(got, got)
    if name is None:
        return f"the request body must be a JSON object, got {got}"
    if name == "messages" and index:
        return f"messages{index} must be an object with a string 'role', got {got}"
    return f"'{name}' must be {_MUST.get(name, 'of another type')}, got {got}"
