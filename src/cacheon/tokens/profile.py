"""Tokenization profiles: encode a request exactly as the worker will, or routing predicts wrong.

A profile is one served model's ``tokenizer.json`` (HF ``tokenizers``), its chat template
(rendered the way transformers' ``apply_chat_template`` does, from what SGLang's chat path passes
it: ``cacheon.tokens.chat``), both pinned by sha256 when the
operator gives a digest, and the engine's quirks. ``completions_bos``: SGLang's OpenAI
completions path for some models encodes without special tokens and prepends one BOS.
What the model directory states (``tokenizer_config.json``'s BOS and EOS, its chat template,
``config.json``'s vocabulary size; ``cacheon.tokens.model_dir``) fills whatever the spec leaves
unset. Encoding goes through an exact window cache (``tokencache``) wherever it can be proven equal.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import jinja2.ext
from jinja2 import Template, nodes
from jinja2.exceptions import TemplateError
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from msgspec import Meta
from tokenizers import Tokenizer

from cacheon.errors import UsageError
from cacheon.tokens.chat import PIN, ContentFormat, Rendering, content_format, reads_tool_call_id, rendered
from cacheon.tokens.model_dir import TOKENIZER_FILE, read_model_dir
from cacheon.tokens.windows import Affixes, WindowEncoder, affixes, anchors, encode_ids


@dataclass(frozen=True)
class TokenizerSpec:
    """What a config file says about one model. ``tokenizer``: its tokenizer.json, or the model
    directory holding it; the directory's own files fill the fields left unset here."""

    tokenizer: Annotated[Path, Meta(description="the model's tokenizer.json, or the model directory holding it")]
    chat_template: Annotated[Path | None, Meta(
        description="a Jinja chat template; default: the model directory's")] = None
    completions_bos: Annotated[bool, Meta(description="prepend BOS on `/v1/completions`, as some models do")] = False
    bos_token: Annotated[str | None, Meta(description="default: the model directory's `tokenizer_config.json`")] = None
    eos_token: Annotated[str | None, Meta(description="default: the model directory's `tokenizer_config.json`")] = None
    tokenizer_sha256: Annotated[str | None, Meta(description="refuse a tokenizer file with another digest")] = None
    chat_template_sha256: Annotated[str | None, Meta(description="refuse a chat template with another digest")] = None


def _pinned(path: Path, expected: str | None) -> tuple[bytes, str]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if expected is not None and digest != expected.lower():
        raise UsageError(f"{path} has sha256 {digest}, the config pins {expected}")
    return data, digest


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson``: plain ``json.dumps`` (Jinja's own sorts keys and escapes HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Generation(jinja2.ext.Extension):
    """transformers' ``{% generation %}`` block: marks assistant text for masks, renders its body as is."""

    tags = {"generation"}  # noqa: RUF012  (jinja2.ext.Extension declares it a set)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def chat_environment() -> ImmutableSandboxedEnvironment:
    """The Jinja environment transformers renders chat templates in (its filters, globals, extensions)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env


class TokenizerProfile:
    """Encodes completions and chat requests for one served model."""

    def __init__(self, spec: TokenizerSpec) -> None:
        path = spec.tokenizer / TOKENIZER_FILE if spec.tokenizer.is_dir() else spec.tokenizer
        data, self.tokenizer_sha256 = _pinned(path, spec.tokenizer_sha256)
        try:
            self.tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # tokenizers raises plain Exception on a bad file
            raise UsageError(f"{path} is not a tokenizer.json: {exc}") from None
        found = read_model_dir(path.parent)
        self.bos_token = spec.bos_token or found.bos_token
        self.eos_token = spec.eos_token or found.eos_token
        self.vocab_size = found.vocab_size
        self.spec = spec
        self.template = None
        self.chat_template_sha256 = None
        source = b""
        if spec.chat_template is not None:
            source, self.chat_template_sha256 = _pinned(spec.chat_template, spec.chat_template_sha256)
        elif found.chat_template is not None:
            source = found.chat_template.encode("utf-8")
            self.chat_template_sha256 = hashlib.sha256(source).hexdigest()
            if spec.chat_template_sha256 is not None and self.chat_template_sha256 != spec.chat_template_sha256.lower():
                raise UsageError(f"the chat template in {found.chat_template_path} has sha256 "
                                 f"{self.chat_template_sha256}, the config pins {spec.chat_template_sha256}")
        self.content_format, self.reads_tool_call_id = ContentFormat.STRING, False
        if source:
            env = chat_environment()
            text = source.decode("utf-8")
            self.template = env.from_string(text)
            self.content_format, self.reads_tool_call_id = content_format(text, env), reads_tool_call_id(text)
        config = json.loads(data)
        self.windows = WindowEncoder(
            self.tokenizer, anchors(config, source.decode("utf-8"), (self.bos_token, self.eos_token)))
        self._affixes = affixes(config) if self.windows.enabled else None
        self.bos_id = None
        if self.bos_token is not None:
            self.bos_id = self.tokenizer.token_to_id(self.bos_token)
            if self.bos_id is None:
                raise UsageError(f"bos_token {self.bos_token!r} is not in {path}")
        if spec.completions_bos and self.bos_id is None:
            raise UsageError("completions_bos needs bos_token")
        self._bos: Affixes = ((self.bos_id,), ()) if self.bos_id is not None else ((), ())

    def encode(self, text: str) -> list[int]:
        """Plain encoding with the tokenizer's own special-token rule (SGLang ``/generate``)."""
        if self._affixes is None:
            return encode_ids(self.tokenizer, text, add_special_tokens=True)
        return self.windows.encode(text, self._affixes)

    def encode_completion(self, prompt: str) -> list[int]:
        """``/v1/completions``: the quirk, if any, is applied here."""
        if self.spec.completions_bos:
            return self.windows.encode(prompt, self._bos)
        return self.encode(prompt)

    def render_chat(self, request: Mapping[str, Any], releases: Iterable[str] = (PIN,)) -> tuple[str, str | None]:
        """The template's text for a chat request as SGLang ``releases`` render it, and the assistant
        prefix appended after it (``continue_final_message``). Raises ``NotPredictable`` where that
        rendering cannot be reproduced."""
        if self.template is None:
            raise UsageError("this model has no chat template")
        render = functools.partial(self._render, self.template)
        return rendered(request, releases, self.content_format, self.reads_tool_call_id, render)

    def _render(self, template: Template, r: Rendering) -> tuple[str, str | None]:
        specials = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}

        def render(tools: list[dict[str, Any]] | None) -> str:
            return template.render(**{**specials, **r.kwargs}, messages=r.messages, tools=tools,
                                   documents=None, add_generation_prompt=True)

        try:
            text = render(r.tools)
        except Exception:  # SGLang retries on any error, with each tool's function alone
            flat = [t.get("function", t) for t in r.tools] if r.tools else None
            try:
                text = render(flat)
            except Exception as exc:  # SGLang: a 400 for TemplateError and TypeError, a 500 for the rest
                raise UsageError(f"chat template: {exc}") from None
        return text, r.assistant_prefix

    def encode_chat(self, request: Mapping[str, Any], releases: Iterable[str] = (PIN,)) -> list[int]:
        """As SGLang's chat path: the rendering encoded with no specials added, then the assistant
        prefix encoded on its own with a leading BOS dropped."""
        text, prefix = self.render_chat(request, releases)
        ids = self.windows.encode(text)
        if prefix:
            tail = encode_ids(self.tokenizer, prefix, add_special_tokens=True)
            ids = [*ids, *(tail[1:] if tail and tail[0] == self.bos_id else tail)]
        return ids
