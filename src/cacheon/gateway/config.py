"""The gateway's config file (YAML or TOML): parsed once, validated with messages that say where."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from cacheon.errors import UsageError
from cacheon.tokens.profile import TokenizerSpec

POLICIES = ("rr", "exact", "approx")

# Reviewed probe texts for token parity: plain words, spacing, digits, punctuation, non-ASCII.
DEFAULT_PROBES = (
    "Hello, world!",
    "  leading and   repeated spaces\nand a newline",
    "3.14159 and 42 and 1e-9",
    "naïve café – “quotes” 漢字 🙂",
)


@dataclass(frozen=True)
class WorkerSpec:
    """A worker as configured: the URL alone, or with values to check against discovery."""

    url: str
    id: str | None = None
    sglang_version: str | None = None
    model: str | None = None
    kv_port: int | None = None
    kv_replay_port: int | None = None
    page_size: int | None = None
    dp_size: int | None = None


@dataclass(frozen=True)
class GatewayConfig:
    host: str
    port: int
    policy: str
    workers: list[WorkerSpec]
    models: dict[str, TokenizerSpec]
    request_timeout_s: float = 60.0
    load_epsilon: float = 0.25
    min_prefix_blocks: int = 1
    min_match_ratio: float = 0.5
    health_interval_s: float = 2.0
    attest_interval_s: float = 300.0
    attest_retry_s: float = 30.0
    challenge_timeout_s: float = 5.0
    drain_timeout_s: float = 30.0
    breaker_failures: int = 3
    breaker_open_s: float = 5.0
    approx_max_entries: int = 100_000
    probes: list[str] = field(default_factory=lambda: list(DEFAULT_PROBES))


_TOP = (set(GatewayConfig.__dataclass_fields__) - {"host", "port"}) | {"listen"}
_STRINGS = ("_token", "_sha256")
_MODEL = {"tokenizer", "chat_template", "completions_bos", "bos_token", "eos_token", "tokenizer_sha256",
          "chat_template_sha256"}


def _check_keys(where: str, got: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(got) - allowed)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")


def _typed(where: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float, (int, float))):
        raise UsageError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def worker_spec(raw: Any, where: str = "worker") -> WorkerSpec:
    """One worker entry (config file or ``POST /workers`` body)."""
    _typed(where, raw, dict)
    _check_keys(where, raw, set(WorkerSpec.__dataclass_fields__))
    url = _typed(f"{where}.url", raw.get("url"), str).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{where}.url: {url!r} is not http(s)://HOST:PORT")
    values: dict[str, Any] = {"url": url}
    for name in ("id", "sglang_version", "model"):
        if name in raw:
            values[name] = _typed(f"{where}.{name}", raw[name], str)
    for name in ("kv_port", "kv_replay_port", "page_size", "dp_size"):
        if name in raw:
            value = _typed(f"{where}.{name}", raw[name], int)
            if value < 1:
                raise UsageError(f"{where}.{name}: must be >= 1")
            values[name] = value
    return WorkerSpec(**values)


def parse(raw: Any, base: Path) -> GatewayConfig:
    """Validate a parsed document; relative tokenizer paths resolve against ``base``."""
    _typed("config", raw, dict)
    _check_keys("config", raw, _TOP)
    host, sep, port = _typed("listen", raw.get("listen", "127.0.0.1:8080"), str).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"listen: {raw.get('listen')!r} is not HOST:PORT")
    policy = raw.get("policy", "exact")
    if policy not in POLICIES:
        raise UsageError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}")
    workers = [worker_spec(w, f"workers[{i}]") for i, w in enumerate(_typed("workers", raw.get("workers", []), list))]
    models: dict[str, TokenizerSpec] = {}
    for name, spec in _typed("models", raw.get("models", {}), dict).items():
        where = f"models.{name}"
        _typed(where, spec, dict)
        _check_keys(where, spec, _MODEL)
        tokenizer = _typed(f"{where}.tokenizer", spec.get("tokenizer"), str)
        template = spec.get("chat_template")
        models[name] = TokenizerSpec(
            tokenizer=base / tokenizer,
            chat_template=None if template is None else base / _typed(f"{where}.chat_template", template, str),
            completions_bos=_typed(f"{where}.completions_bos", spec.get("completions_bos", False), bool),
            **{k: _typed(f"{where}.{k}", spec[k], str) for k in _MODEL if k in spec and k.endswith(_STRINGS)},
        )
    if policy in ("exact", "approx") and not models:
        raise UsageError(f"policy {policy} tokenizes requests: configure at least one model under models")
    extra: dict[str, Any] = {}
    for name in _TOP - {"listen", "policy", "workers", "models", "probes"}:
        if name in raw:
            kind = int if name in ("min_prefix_blocks", "breaker_failures", "approx_max_entries") else (int, float)
            value = _typed(name, raw[name], kind)
            if value < 0 or (value == 0 and name not in ("load_epsilon", "min_match_ratio")):
                raise UsageError(f"{name}: must be > 0")
            if name == "min_match_ratio" and value > 1:
                raise UsageError("min_match_ratio: must be between 0 and 1")
            extra[name] = value
    if "probes" in raw:
        probes = _typed("probes", raw["probes"], list)
        extra["probes"] = [_typed("probes[]", p, str) for p in probes]
    return GatewayConfig(host, int(port), policy, workers, models, **extra)


def load(path: Path) -> GatewayConfig:
    """Read ``path`` (``.toml``, or YAML otherwise) and validate it."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {exc}") from None
    return parse(raw, path.parent)
