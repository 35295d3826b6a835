"""The gateway's config file (YAML or TOML), decoded into typed structures whose errors name their path.

msgspec validates while it converts, so an error says where it is (``workers[0].kv_port: expected
int, got str``). Environment variables override keys (``env_overrides``): ``CACHEON_GATEWAY_`` and
the key's path in capitals, ``__`` between levels (``CACHEON_GATEWAY_ADMIN__TOKEN``); each value
is read as YAML, so ``5``, ``true`` and ``[{url: http://w:30000}]`` keep their types.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

import msgspec
import yaml
from msgspec import Meta

from cacheon.errors import UsageError
from cacheon.kv.wire import WireBounds
from cacheon.tokens.profile import TokenizerSpec

ENV_PREFIX = "CACHEON_GATEWAY_"

# Reviewed probe texts for token parity: plain words, spacing, digits, punctuation, non-ASCII.
DEFAULT_PROBES = (
    "Hello, world!",
    "  leading and   repeated spaces\nand a newline",
    "3.14159 and 42 and 1e-9",
    "naïve café – “quotes” 漢字 🙂",
)

PolicyName = Literal["rr", "exact", "approx"]
POLICIES: tuple[str, ...] = get_args(PolicyName)
Port = Annotated[int, Meta(ge=1, le=65535)]
Positive = Annotated[int, Meta(ge=1)]
Seconds = Annotated[float, Meta(gt=0)]
Ratio = Annotated[float, Meta(ge=0, le=1)]
_CONFIG = {"forbid_unknown_fields": True, "frozen": True, "kw_only": True}


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 hosts in brackets) as (host, port); ValueError says what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _listen(listen: str) -> None:
    try:
        split_listen(listen)
    except ValueError as exc:
        raise ValueError(f"listen: {exc}") from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WorkerSpec(msgspec.Struct, **_CONFIG):
    """A worker as configured: the URL alone, or with values to check against discovery."""

    url: str
    id: str | None = None
    sglang_version: str | None = None
    model: str | None = None
    kv_port: Port | None = None
    kv_replay_port: Port | None = None
    page_size: Positive | None = None
    dp_size: Positive | None = None

    def __post_init__(self) -> None:
        url = self.url.rstrip("/")
        scheme, sep, rest = url.partition("://")
        if scheme not in ("http", "https") or not sep or not rest.split("/")[0].rsplit(":", 1)[0]:
            raise ValueError(f"url: {self.url!r} is not http(s)://HOST:PORT")
        msgspec.structs.force_setattr(self, "url", url)


class WorkersDns(msgspec.Struct, **_CONFIG):
    """Workers found by resolving a name (a Kubernetes headless Service): one worker per address."""

    name: str
    port: Port
    scheme: Literal["http", "https"] = "http"
    interval_s: Seconds = 10.0


class AdminConfig(msgspec.Struct, **_CONFIG):
    """The admin API's own listener. Off loopback it must have a bearer token."""

    listen: str | None = "127.0.0.1:8081"  # None: no admin listener
    token: str | None = None
    token_file: str | None = None

    def __post_init__(self) -> None:
        if self.listen is not None:
            _listen(self.listen)
        if self.token is not None and self.token_file is not None:
            raise ValueError("token: set token or token_file, not both")


class TracingConfig(msgspec.Struct, **_CONFIG):
    """OpenTelemetry spans per request (the ``otel`` extra). Off by default."""

    enabled: bool = False
    exporter: Literal["otlp", "console"] = "otlp"
    endpoint: str | None = None  # OTLP/HTTP traces URL; None: the exporter's default / OTEL_* variables
    service_name: str = "cacheon-gateway"


class GatewayConfig(msgspec.Struct, **_CONFIG):
    listen: str = "127.0.0.1:8080"
    policy: PolicyName = "exact"
    workers: list[WorkerSpec] = []
    workers_dns: list[WorkersDns] = []
    models: dict[str, TokenizerSpec] = {}
    admin: AdminConfig = AdminConfig()
    kv_wire: WireBounds = WireBounds()  # what one KV batch may carry (kv/wire.py)
    kv_max_replay: Positive = 10_000  # a sequence jump past this clears the rank and rebuilds it
    tracing: TracingConfig = TracingConfig()
    request_timeout_s: Seconds = 60.0
    max_body_bytes: Positive = 32 << 20
    load_epsilon: Annotated[float, Meta(ge=0)] = 0.25
    min_prefix_blocks: Positive = 1
    min_match_ratio: Ratio = 0.5
    health_interval_s: Seconds = 2.0
    attest_interval_s: Seconds = 300.0
    attest_retry_s: Seconds = 30.0
    challenge_timeout_s: Seconds = 5.0
    drain_timeout_s: Seconds = 30.0
    breaker_failures: Positive = 3
    breaker_open_s: Seconds = 5.0
    approx_max_entries: Positive = 100_000
    probes: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_PROBES))

    def __post_init__(self) -> None:
        _listen(self.listen)

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]


DEFAULTS = GatewayConfig(policy="rr")  # every default, for benchmarks that reproduce the gateway's choices


class _ModelEntry(msgspec.Struct, **_CONFIG):
    """One ``models.<name>`` entry as written; paths resolve against the config file's directory."""

    tokenizer: str
    chat_template: str | None = None
    completions_bos: bool = False
    bos_token: str | None = None
    eos_token: str | None = None
    tokenizer_sha256: str | None = None
    chat_template_sha256: str | None = None


def _allowed(path: str) -> list[str]:
    """The keys the mapping at ``path`` (``workers[0]``, ``admin``) takes, or [] if it is not a struct."""
    kind: Any = GatewayConfig
    for part in re.findall(r"\w+|\[\d+\]", path):
        if part.startswith("["):
            kind = get_args(kind)[0]  # a list's element type
        elif isinstance(kind, type) and issubclass(kind, msgspec.Struct) and part in kind.__struct_fields__:
            kind = get_type_hints(kind)[part]
            kind = next((a for a in get_args(kind) if a is not type(None)), kind) if get_origin(kind) is UnionType \
                else kind
        else:
            return []
    return sorted(kind.__struct_fields__) if isinstance(kind, type) and issubclass(kind, msgspec.Struct) else []


_PATH = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def _error(exc: msgspec.ValidationError, prefix: str, env: Mapping[str, str]) -> UsageError:
    """``path: message`` for a msgspec error (``$.workers[0].kv_port`` -> ``workers[0].kv_port``)."""
    match = _PATH.match(str(exc))
    assert match is not None  # the pattern matches any text
    message = match["message"].replace("`", "")
    message = message[0].lower() + message[1:] if message else message
    message = re.sub(r"^object contains unknown field (\S+)", r"unknown key \1", message)
    message = re.sub(r"^object missing required field (\S+)", r"missing required key \1", message)
    path = (prefix + (match["path"] or "")).lstrip(".")
    field_first = re.match(r"^(\w+): (.*)$", message, re.DOTALL)  # a __post_init__ check names its field
    if field_first:
        path, message = f"{path}.{field_first[1]}".lstrip("."), field_first[2]
    if message.startswith("unknown key") and not prefix.startswith("models."):
        message += f" (allowed: {', '.join(sorted(_allowed(path)))})"
    path = path or "config"
    if path == "policy" and message.startswith("invalid enum value"):
        message += f" (one of {', '.join(POLICIES)})"
    origin = env.get(path.split("[")[0].split(".")[0])
    return UsageError(f"{path}{f' (from {origin})' if origin else ''}: {message}")


def worker_spec(raw: Any, where: str = "worker") -> WorkerSpec:
    """One worker entry (config file or ``POST /workers`` body)."""
    try:
        return msgspec.convert(raw, WorkerSpec)
    except msgspec.ValidationError as exc:
        raise _error(exc, where, {}) from None


def _models(raw: Any, base: Path) -> dict[str, TokenizerSpec]:
    if not isinstance(raw, dict):
        raise UsageError(f"models: expected a mapping of model name to profile, got {type(raw).__name__}")
    out = {}
    for name, entry in raw.items():
        try:
            spec = msgspec.convert(entry, _ModelEntry)
        except msgspec.ValidationError as exc:
            error = _error(exc, f"models.{name}", {})
            if str(error).startswith(f"models.{name}: unknown key"):
                error = UsageError(f"{error} (allowed: {', '.join(_ModelEntry.__struct_fields__)})")
            raise error from None
        values = msgspec.structs.asdict(spec)
        values["tokenizer"] = base / spec.tokenizer
        values["chat_template"] = None if spec.chat_template is None else base / spec.chat_template
        out[str(name)] = TokenizerSpec(**values)
    return out


def env_overrides(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """Apply ``CACHEON_GATEWAY_*`` variables to ``raw`` in place; returns {top-level key: variable}."""
    applied: dict[str, str] = {}
    known = set(GatewayConfig.__struct_fields__)
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX):
            continue
        path = var[len(ENV_PREFIX):].lower().split("__")
        if path[0] not in known:
            raise UsageError(f"{var}: no config key {path[0]!r} (known: {', '.join(sorted(known))})")
        try:
            value = yaml.safe_load(environ[var])
        except yaml.YAMLError as exc:
            raise UsageError(f"{var}: not a YAML value: {exc}") from None
        node = raw
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise UsageError(f"{var}: {key} is not a mapping in the config")
            node = child
        node[path[-1]] = value
        applied[path[0]] = var
    return applied


def parse(raw: Any, base: Path, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Validate a parsed document (plus ``environ``'s overrides); relative tokenizer paths resolve against ``base``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"config: expected a mapping of keys, got {type(raw).__name__}")
    raw = dict(raw)
    env = env_overrides(raw, environ or {})
    models = _models(raw.pop("models", {}), base)
    try:
        cfg = msgspec.structs.replace(msgspec.convert(raw, GatewayConfig), models=models)
    except msgspec.ValidationError as exc:
        raise _error(exc, "", env) from None
    if cfg.policy in ("exact", "approx") and not cfg.models:
        raise UsageError(f"policy {cfg.policy} tokenizes requests: configure at least one model under models")
    return cfg


def load(path: Path, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read ``path`` (``.toml``, or YAML otherwise), apply ``environ``'s overrides (default: this process's)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = (f"{getattr(exc, 'problem', None) or exc} (line {mark.line + 1}, column {mark.column + 1})"
                 if mark is not None else " ".join(str(exc).split()))
        raise UsageError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {where}") from None
    return parse(raw, path.parent, os.environ if environ is None else environ)
