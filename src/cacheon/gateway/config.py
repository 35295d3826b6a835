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
from urllib.parse import urlsplit

import msgspec
import yaml
from msgspec import Meta

from cacheon.errors import UsageError, did_you_mean
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


_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")  # DNS names and IPv4 literals


def _url_problem(url: str) -> str | None:
    """Why ``url`` is not a worker's base URL (scheme, host, optional port, nothing else), or None.

    Default-deny: anything but printable ASCII, user info, a path, a query or a fragment is refused
    here, so no request later fails on it (urllib alone accepts ``http://h h:1`` and strips CR/LF)."""
    if re.search(r"[^\x21-\x7e]", url):
        return "whitespace or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return str(exc).lower()
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
    if parts.username is not None or parts.password is not None:
        return "user info"
    if parts.path.strip("/") or parts.query or parts.fragment or url.endswith(("?", "#")):
        return "a path, query or fragment"
    if not host:
        return "no host"
    if port == 0:
        return "port 0"
    if "[" in parts.netloc or "]" in parts.netloc:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r} is not an IPv6 address"
        if not re.fullmatch(r"\[[^\]]+\](:\d+)?", parts.netloc):
            return f"{parts.netloc!r} is not [IPv6]:PORT"
    elif not _HOSTNAME.fullmatch(host):
        return f"host {host!r}"
    return None


class WorkerSpec(msgspec.Struct, **_CONFIG):
    """A worker as configured: the URL alone, or with values to check against discovery."""

    url: Annotated[str, Meta(description="`http(s)://HOST:PORT` of the worker")]
    id: Annotated[str | None, Meta(description="the worker's id (default `w0`, `w1`, … in order)")] = None
    sglang_version: Annotated[str | None, Meta(
        description="checked against discovery (`identity_mismatch` when it differs)")] = None
    model: Annotated[str | None, Meta(
        description="checked against the discovered served model (`identity_mismatch`)")] = None
    kv_port: Annotated[Port | None, Meta(
        description="KV events port base, checked against discovery (`engine_geometry_mismatch`)")] = None
    kv_replay_port: Annotated[Port | None, Meta(
        description="replay port base; used when the server args name none")] = None
    page_size: Annotated[Positive | None, Meta(
        description="checked against discovery (`engine_geometry_mismatch`)")] = None
    dp_size: Annotated[Positive | None, Meta(
        description="checked against discovery (`engine_geometry_mismatch`)")] = None

    def __post_init__(self) -> None:
        why = _url_problem(self.url)
        if why is not None:
            raise ValueError(f"url: {self.url!r} is not http(s)://HOST:PORT ({why})")
        msgspec.structs.force_setattr(self, "url", self.url.rstrip("/"))


class WorkersDns(msgspec.Struct, **_CONFIG):
    """Workers found by resolving a name (a Kubernetes headless Service): one worker per address."""

    name: Annotated[str, Meta(description="a name to resolve (a Kubernetes headless Service): one worker per address")]
    port: Annotated[Port, Meta(description="the workers' HTTP port")]
    scheme: Annotated[Literal["http", "https"], Meta(description="the workers' URL scheme")] = "http"
    interval_s: Annotated[Seconds, Meta(
        description="how often to resolve again; vanished addresses are drained and removed")] = 10.0


class AdminConfig(msgspec.Struct, **_CONFIG):
    """The admin API's own listener. Off loopback it must have a bearer token."""

    listen: Annotated[str | None, Meta(
        description="`HOST:PORT` of the admin API; null: no admin listener")] = "127.0.0.1:8081"
    token: Annotated[str | None, Meta(description="bearer token the admin API requires (required off loopback)")] = None
    token_file: Annotated[str | None, Meta(description="a file holding the token, instead of `token`; serving creates "
                                           "it with a fresh token (mode 0600) if it does not exist")] = None

    def __post_init__(self) -> None:
        if self.listen is not None:
            _listen(self.listen)
        if self.token is not None and self.token_file is not None:
            raise ValueError("token: set token or token_file, not both")


class TracingConfig(msgspec.Struct, **_CONFIG):
    """OpenTelemetry spans per request (the ``otel`` extra). Off by default."""

    enabled: Annotated[bool, Meta(description="one OpenTelemetry span per proxied request (the `otel` extra)")] = False
    exporter: Annotated[Literal["otlp", "console"], Meta(description="OTLP over HTTP, or the console")] = "otlp"
    endpoint: Annotated[str | None, Meta(
        description="OTLP/HTTP traces URL; null: the exporter's default / `OTEL_*` variables")] = None
    service_name: Annotated[str, Meta(description="the spans' `service.name`")] = "cacheon-gateway"


class EventPlaneConfig(msgspec.Struct, **_CONFIG):
    """Fleet state through NATS JetStream (the ``fleet`` extra): KV events published by
    ``cacheon kv relay`` instead of each worker's ZMQ publisher, snapshots of each worker's index,
    and the replicas' in-flight load. Absent: the gateway subscribes to the workers directly."""

    url: Annotated[str, Meta(description="the NATS server, `nats://HOST:PORT` (several comma-separated)")]
    stream: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$",
                                description="the JetStream stream the relays publish KV batches to")] = "CACHEON_KV"
    snapshot_bucket: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$",
                                         description="the object store holding each worker's index snapshot")] = (
        "cacheon-snapshots")
    kv_events: Annotated[Literal["relay", "workers"], Meta(
        description="`relay`: KV events from the plane (`cacheon kv relay` publishes them; snapshots, no worker "
        "replay endpoint needed); `workers`: from each worker's ZMQ publisher, the plane carrying shared load "
        "only")] = "relay"
    staleness_s: Annotated[Seconds, Meta(
        description="a worker not heard from (events or heartbeat) for this long is not routed to")] = 10.0
    share_load: Annotated[bool, Meta(
        description="publish this replica's routing decisions and completions, and count the others' "
        "(the `exact` policy's cost model)")] = True
    load_heartbeat_s: Annotated[Seconds, Meta(
        description="how often a replica lists its requests in flight to the others (a lost end counts this "
        "long)")] = 1.0
    load_expiry_s: Annotated[Seconds, Meta(
        description="a replica not heard from for this long loses its requests in flight elsewhere")] = 3.0

    def __post_init__(self) -> None:
        if self.load_expiry_s <= self.load_heartbeat_s:
            raise ValueError(f"load_expiry_s ({self.load_expiry_s:g}) must be longer than load_heartbeat_s "
                             f"({self.load_heartbeat_s:g}): a live replica would expire between its heartbeats")
        for part in self.url.split(","):
            if urlsplit(part.strip()).scheme not in ("nats", "tls"):
                raise ValueError(f"url: {part.strip()!r} is not nats://HOST:PORT")


class RelayConfig(msgspec.Struct, **_CONFIG):
    """``cacheon kv relay --config``: the event plane and the workers to follow. Every relay may list every
    worker: the leases share them out, and a dead relay's workers go to the others."""

    event_plane: Annotated[EventPlaneConfig, Meta(description="the NATS server, stream and snapshot bucket")]
    workers: Annotated[list[WorkerSpec], Meta(
        description="workers to follow; each is named on the plane by its `id`, else its URL (as gateways name it)")]
    relay_id: Annotated[str | None, Meta(description="this relay's name in leases and logs (default HOST-PID)")] = None
    lease_s: Annotated[Seconds, Meta(description="a worker's lease expires this long after its relay last renewed "
                                     "it: how long a dead relay's workers wait for another")] = 6.0
    heartbeat_s: Annotated[Seconds, Meta(description="a heartbeat per followed worker this often")] = 1.0
    snapshot_interval_s: Annotated[Seconds, Meta(
        description="write each worker's index snapshot this often (well below retention_s)")] = 10.0
    retention_s: Annotated[Seconds, Meta(description="the stream's max_age when the relay creates it")] = 3600.0
    request_timeout_s: Annotated[Seconds, Meta(description="timeout of worker discovery calls")] = 10.0
    kv_wire: Annotated[WireBounds, Meta(description="bounds on KV event batches")] = WireBounds()
    kv_max_replay: Annotated[Positive, Meta(description="the most batches one gap may replay")] = 10_000

    def __post_init__(self) -> None:
        if self.event_plane.kv_events != "relay":
            raise ValueError("event_plane.kv_events: a relay publishes KV events; `workers` is a gateway's setting")


class GatewayConfig(msgspec.Struct, **_CONFIG):
    listen: Annotated[str, Meta(description="`HOST:PORT` of the traffic listener")] = "127.0.0.1:8080"
    policy: Annotated[PolicyName, Meta(
        description="routing policy; `exact` and `approx` need at least one entry under `models`")] = "exact"
    workers: Annotated[list[WorkerSpec], Meta(
        description="workers to register at start (more through the admin API)")] = []
    workers_dns: Annotated[list[WorkersDns], Meta(description="workers found by DNS")] = []
    models: Annotated[dict[str, TokenizerSpec], Meta(
        description="tokenization profiles, keyed by served model name")] = {}
    admin: Annotated[AdminConfig, Meta(description="the admin API's own listener")] = AdminConfig()
    kv_wire: Annotated[WireBounds, Meta(
        description="what one KV batch may carry; past it the batch is refused whole")] = WireBounds()
    kv_max_replay: Annotated[Positive, Meta(
        description="the most one sequence hole asks the replay endpoint for; a longer jump clears the rank")] = 10_000
    tracing: Annotated[TracingConfig, Meta(description="OpenTelemetry tracing, off by default")] = TracingConfig()
    event_plane: Annotated[EventPlaneConfig | None, Meta(
        description="fleet state through NATS JetStream; null: each worker's ZMQ publisher directly")] = None
    request_timeout_s: Annotated[Seconds, Meta(
        description="upstream timeout: a whole call; for a stream, its head (and a 5xx's body) in all, then "
        "the longest gap between chunks")] = 60.0
    max_body_bytes: Annotated[Positive, Meta(description="largest request body (413 beyond)")] = 32 << 20
    max_answer_bytes: Annotated[Positive, Meta(
        description="largest non-streamed answer a worker may send (read whole); past it the client gets 502 "
        "answer_too_large, not retried (a 5xx's body: 64 KiB, past it the worker has failed)")] = 128 << 20
    client_write_timeout_s: Annotated[Seconds, Meta(
        description="a streaming client whose side stays full (it does not read) this long is dropped (499), "
        "freeing its worker")] = 30.0
    keepalive_timeout_s: Annotated[Seconds, Meta(
        description="a client connection with no complete request head for this long is closed: idle "
        "between requests, or headers still arriving (the header read deadline)")] = 15.0
    body_timeout_s: Annotated[Seconds, Meta(
        description="a request body not fully received this long after its headers closes the connection")] = 30.0
    load_epsilon: Annotated[Annotated[float, Meta(ge=0)], Meta(description="`approx`'s load bound ε (may be 0)")] = 0.25
    min_prefix_blocks: Annotated[Positive, Meta(description="`approx`: the shallowest match that counts as a hit")] = 1
    min_match_ratio: Annotated[Ratio, Meta(
        description="`approx`: a match must also cover this share of the prompt's chunks (0: off)")] = 0.5
    health_interval_s: Annotated[Seconds, Meta(description="health-check and re-attestation cadence")] = 2.0
    attest_interval_s: Annotated[Seconds, Meta(description="re-attest a READY worker after this long")] = 300.0
    attest_retry_s: Annotated[Seconds, Meta(description="retry the ladder for a FENCED worker after this long")] = 30.0
    challenge_timeout_s: Annotated[Seconds, Meta(description="how long to wait for the hash challenge's echoes")] = 5.0
    drain_timeout_s: Annotated[Seconds, Meta(
        description="the most time removing a worker waits for its requests in flight")] = 30.0
    breaker_failures: Annotated[Positive, Meta(description="consecutive failures that open a worker's breaker")] = 3
    breaker_open_s: Annotated[Seconds, Meta(description="how long an open breaker stays open")] = 5.0
    approx_max_entries: Annotated[Positive, Meta(description="LRU bound on the `approx` trie's nodes")] = 100_000
    probes: Annotated[list[str], Meta(description="token-parity probe texts for the attestation ladder")] = (
        msgspec.field(default_factory=lambda: list(DEFAULT_PROBES)))

    def __post_init__(self) -> None:
        _listen(self.listen)

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]


# What a reload applies to a running gateway (the fleet reads them at each use); any other key is fixed
# at start, so a reload that changes one is refused whole.
RELOADABLE = frozenset({"workers", "health_interval_s", "attest_interval_s", "attest_retry_s",
                        "challenge_timeout_s", "probes"})


def changed_keys(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The top-level keys whose values differ between two configs."""
    return [key for key in GatewayConfig.__struct_fields__ if getattr(old, key) != getattr(new, key)]


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
        key = message.split()[2] if len(message.split()) > 2 else ""
        message += f" (allowed: {', '.join(sorted(_allowed(path)))}){did_you_mean(key, _allowed(path))}"
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
                key = str(error).split()[-1]
                error = UsageError(f"{error} (allowed: {', '.join(_ModelEntry.__struct_fields__)})"
                                   f"{did_you_mean(key, _ModelEntry.__struct_fields__)}")
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
    return parse(_read(path), path.parent, os.environ if environ is None else environ)


def load_relay(path: Path) -> RelayConfig:
    """Read a relay's config file (``.toml``, or YAML otherwise)."""
    try:
        return msgspec.convert(_read(path) or {}, RelayConfig)
    except msgspec.ValidationError as exc:
        raise UsageError(f"{path}: {exc}".replace("`", "")) from None


def _read(path: Path) -> Any:
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
    return raw
