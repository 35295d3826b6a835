"""The gateway's HTTP surface on aiohttp.web: the traffic listener and the admin listener.

Traffic: the OpenAI-compatible and SGLang-native routes, probes (``/livez``, ``/readyz``, and
``/health`` as an alias of readiness), ``/metrics`` and a ``/status`` summary without worker URLs.
Admin, on its own listener (loopback by default, a bearer token required off it, web pages refused):
add, list, inspect, drain and remove workers, the full ``/status``, and reload the config. Every
error, unknown routes included, is an OpenAI-shaped JSON error. Connections that never finish a
request head (``keepalive_timeout_s``) or body (``body_timeout_s``) are closed.

aiohttp.web rather than an ASGI stack: it writes a response's headers and body in one system call
and has no middleware on the path, which measured as most of the proxy's own cost (issue 13).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cacheon.errors import UsageError
from cacheon.gateway.config import GatewayConfig, is_loopback, load, split_listen, worker_spec
from cacheon.gateway.dashboard import Dashboard
from cacheon.gateway.protocol import Runner
from cacheon.gateway.refusals import Refusal, oai_error
from cacheon.gateway.service import Gateway

log = logging.getLogger("cacheon.gateway")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_json = msgspec.json.Encoder()


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(body=_json.encode(data), status=status, content_type="application/json")


def _fallback(gw: Gateway, routes: dict[str, set[str]]) -> Handler:
    """Unknown routes: 404, or 405 naming the methods the path takes; OpenAI-shaped either way."""

    async def handler(request: web.Request) -> web.StreamResponse:
        gw.metrics.rejects.labels(Refusal.UNKNOWN_ROUTE).inc()
        allowed = routes.get(request.path)
        if allowed:
            methods = ", ".join(sorted(allowed))
            return oai_error(405, f"{request.method} is not allowed on {request.path} (use {methods})",
                             code="method_not_allowed", headers={"Allow": methods})
        known = ", ".join(sorted(routes))
        return oai_error(404, f"no route {request.method} {request.path} (routes: {known})", code="not_found")

    return handler


def _cut_if_unread(request: web.Request, timeout_s: float) -> None:
    """The body deadline passed: close the connection if the body has still not all arrived."""
    if not request.content.is_eof() and request.transport is not None:
        log.info(f"closed {request.remote}: its request body did not arrive within body_timeout_s ({timeout_s})",
                 extra={"fields": {"peer": request.remote, "path": request.path[:200]}})
        request.transport.close()  # the handler is cancelled with the connection (handler_cancellation)


def _body_deadline(handler: Handler, timeout_s: float) -> Handler:
    """A request whose body is still arriving ``timeout_s`` after its headers loses its connection.

    aiohttp has no body read deadline; a timer per request with a body costs a few microseconds."""

    async def deadlined(request: web.Request) -> web.StreamResponse:
        if not request.can_read_body:
            return await handler(request)
        timer = asyncio.get_running_loop().call_later(timeout_s, _cut_if_unread, request, timeout_s)
        try:
            return await handler(request)
        finally:
            timer.cancel()

    return deadlined


def _app(gw: Gateway, routes: list[tuple[str, str, Handler]], **kwargs: object) -> web.Application:
    app = web.Application(**kwargs)  # type: ignore[arg-type]  # aiohttp's keyword arguments, passed on
    table: dict[str, set[str]] = {}
    for method, path, handler in routes:
        app.router.add_route(method, path, _body_deadline(handler, gw.cfg.body_timeout_s))
        table.setdefault(path, set()).add(method)
    app.router.add_route("*", "/{tail:.*}", _fallback(gw, table))
    return app


def traffic_app(gw: Gateway) -> web.Application:
    cfg = gw.cfg

    def proxied(path: str, kind: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await gw.proxy.handle(request, path, kind)

        return handler

    async def models(_: web.Request) -> web.StreamResponse:
        names = gw.model_names()
        return json_response({"object": "list", "data": [{"id": n, "object": "model", "created": 0,
                                                           "owned_by": "cacheon"} for n in names]})

    async def livez(_: web.Request) -> web.StreamResponse:
        return json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.StreamResponse:
        ready, detail = gw.readiness()
        return json_response(detail, 200 if ready else 503)

    async def metrics(_: web.Request) -> web.StreamResponse:
        body = await asyncio.to_thread(generate_latest, gw.metrics.registry)  # digests: off the event loop
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status(_: web.Request) -> web.StreamResponse:
        return json_response(gw.summary())

    return _app(gw, [
        ("POST", "/v1/completions", proxied("/v1/completions", "completion")),
        ("POST", "/v1/chat/completions", proxied("/v1/chat/completions", "chat")),
        ("POST", "/generate", proxied("/generate", "generate")),
        ("GET", "/v1/models", models),
        ("GET", "/livez", livez),
        ("GET", "/readyz", readyz),
        ("GET", "/health", readyz),
        ("GET", "/metrics", metrics),
        ("GET", "/status", status),
    ], client_max_size=cfg.max_body_bytes)


def _new_token_file(path: Path) -> str:
    """A fresh token in a new file only its owner can read (``O_EXCL``: never one that appeared meanwhile)."""
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise UsageError(f"admin.token_file: cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    log.warning(f"admin token created in {path} (mode 0600): send it as 'Authorization: Bearer <token>'",
                extra={"fields": {"token_file": str(path)}})
    return token


def admin_token(cfg: GatewayConfig, create: bool = False) -> str | None:
    """The admin bearer token (config, or its file); None when none is set, refused off loopback.
    ``create`` (serving): a ``token_file`` that does not exist yet is created with a fresh token;
    without it (checking a config) such a file gives None."""
    admin = cfg.admin
    token = admin.token
    if admin.token_file is not None:
        path = Path(admin.token_file)
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            if not create:
                return None  # checking only: serving creates it, so there will be a token
            token = _new_token_file(path)
        except OSError as exc:
            raise UsageError(f"admin.token_file: cannot read {admin.token_file}: {exc.strerror}") from None
        if not token:
            raise UsageError(f"admin.token_file: {admin.token_file} is empty")
    if admin.listen is not None and token is None and not is_loopback(split_listen(admin.listen)[0]):
        raise UsageError(f"admin.listen {admin.listen} is not a loopback address: set admin.token or "
                         "admin.token_file (or CACHEON_GATEWAY_ADMIN__TOKEN)")
    return token


def _browser_refusal(request: web.Request, loopback: bool) -> str | None:
    """Why a request may come from a web page rather than an operator's tool, or None.

    A page can send a cross-site POST (``text/plain``, no preflight) and, by DNS rebinding, make its own
    name resolve to 127.0.0.1. So: the ``Origin`` a browser sends must be this listener itself, and on a
    loopback listener the ``Host`` must be a loopback name (a rebound page's ``Host`` is its own name)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        return f"cross-origin request from {origin[:100]!r}"
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return f"a {site[:20]} request from a web page"
    if loopback:
        host, sep, port = request.host.rpartition(":")
        host = host if sep and port.isdigit() else request.host  # without a port
        if not is_loopback(host.removeprefix("[").removesuffix("]")):
            return f"Host {request.host[:100]!r} is not this loopback listener"
    return None


def admin_app(gw: Gateway, token: str | None,
              reload: Callable[[], Awaitable[dict[str, object]]] | None = None) -> web.Application:
    fleet = gw.fleet
    expected = None if token is None else f"Bearer {token}".encode()
    loopback = gw.cfg.admin.listen is not None and is_loopback(split_listen(gw.cfg.admin.listen)[0])

    def guarded(handler: Handler) -> Handler:
        async def checked(request: web.Request) -> web.StreamResponse:
            refused = _browser_refusal(request, loopback)
            if refused is not None:
                gw.metrics.rejects.labels(Refusal.UNAUTHORIZED).inc()
                return oai_error(403, f"the admin API refuses {refused}", code="forbidden")
            given = request.headers.get("Authorization", "").encode()
            if expected is not None and not hmac.compare_digest(given, expected):
                gw.metrics.rejects.labels(Refusal.UNAUTHORIZED).inc()
                return oai_error(401, "the admin API needs 'Authorization: Bearer <admin token>'",
                                 code="unauthorized", headers={"WWW-Authenticate": "Bearer"})
            if request.method == "POST" and request.content_type != "application/json":
                # A web page cannot send this type cross-site without a preflight, which the admin never allows.
                return oai_error(415, f"POST {request.path} needs 'Content-Type: application/json' "
                                 f"(got {request.content_type[:100]!r})", code="unsupported_media_type")
            return await handler(request)

        return checked

    def worker_of(request: web.Request) -> web.Response | None:
        wid = request.match_info["wid"]
        return None if wid in fleet.workers else oai_error(404, f"no worker {wid!r}", code="worker_not_found")

    async def body(request: web.Request) -> object:
        raw = await request.read()
        if not raw.strip():
            return {}
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise UsageError("the request body is not valid JSON") from None

    def deadline(got: object, request: web.Request) -> float | None:
        value = request.query.get("deadline_s", got.get("deadline_s") if isinstance(got, dict) else None)
        if value is None:
            return None
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"deadline_s must be a number of seconds, got {value!r}") from None
        if not 0 <= seconds <= 86_400:
            raise UsageError("deadline_s must be between 0 and 86400")
        return seconds

    async def list_workers(_: web.Request) -> web.StreamResponse:
        return json_response((await gw.status())["workers"])

    async def add_worker(request: web.Request) -> web.StreamResponse:
        try:
            worker = await fleet.add(worker_spec(await body(request)), origin="admin")
        except UsageError as exc:
            return oai_error(400, str(exc))
        return json_response(fleet.status(worker), 201)

    async def get_worker(request: web.Request) -> web.StreamResponse:
        missing = worker_of(request)
        if missing is not None:
            return missing
        worker = fleet.workers[request.match_info["wid"]]
        return json_response(fleet.status(worker, await asyncio.to_thread(fleet.digest, worker)))

    async def drain(request: web.Request) -> web.StreamResponse:
        """Stop new requests to the worker and wait up to ``deadline_s`` (default drain_timeout_s)."""
        missing = worker_of(request)
        if missing is not None:
            return missing
        try:
            seconds = deadline(await body(request), request)
        except UsageError as exc:
            return oai_error(400, str(exc))
        worker = fleet.workers[request.match_info["wid"]]
        drained = await fleet.drain(worker, seconds)
        log.info(f"worker {worker.id} draining", extra={"fields": {"worker": worker.id, "drained": drained,
                                                                   "in_flight_left": worker.in_flight}})
        return json_response({"drained": drained, "in_flight_left": worker.in_flight, **fleet.status(worker)})

    async def remove(request: web.Request) -> web.StreamResponse:
        missing = worker_of(request)
        if missing is not None:
            return missing
        try:
            seconds = deadline(None, request)
        except UsageError as exc:
            return oai_error(400, str(exc))
        worker = fleet.workers[request.match_info["wid"]]
        await fleet.remove(worker, seconds)
        return json_response({"removed": worker.id, "in_flight_left": worker.in_flight})

    async def status(_: web.Request) -> web.StreamResponse:
        return json_response(await gw.status())

    async def reload_config(_: web.Request) -> web.StreamResponse:
        if reload is None:
            return oai_error(409, "this gateway was not started from a config file", code="no_config_file")
        try:
            return json_response(await reload())
        except UsageError as exc:
            return oai_error(400, f"config not reloaded, the running config is kept: {exc}",
                             code="config_rejected")

    board = Dashboard(gw)
    app = _app(gw, [
        ("POST", "/config/reload", guarded(reload_config)),
        ("GET", "/workers", guarded(list_workers)),
        ("POST", "/workers", guarded(add_worker)),
        ("GET", "/workers/{wid}", guarded(get_worker)),
        ("DELETE", "/workers/{wid}", guarded(remove)),
        ("POST", "/workers/{wid}/drain", guarded(drain)),
        ("GET", "/status", guarded(status)),
        *board.routes(guarded),
    ])
    app.cleanup_ctx.append(board.sampling)
    return app


class GatewayServer:
    """Both listeners bound (or a one-line UsageError), then the gateway started; stopped in reverse.

    ``config``: the file the config came from, read again by ``reload`` (SIGHUP, ``POST /config/reload``).
    ``process``: this one's index among several gateway processes on one traffic port (``SO_REUSEPORT``);
    its admin listener is on the admin port + ``process``."""

    def __init__(self, gw: Gateway, config: Path | None = None, process: int | None = None) -> None:
        self.gw = gw
        self.config = config
        self.process = process
        self.token = admin_token(gw.cfg, create=True)
        self._runners: list[web.AppRunner] = []
        self._reloading = asyncio.Lock()
        self.addresses: dict[str, str] = {}

    async def start(self) -> None:
        cfg = self.gw.cfg
        listeners = [("listen", cfg.listen, traffic_app(self.gw))]
        if cfg.admin.listen is not None:
            reload = self.reload if self.config is not None else None
            listeners.append(("admin.listen", cfg.admin.listen, admin_app(self.gw, self.token, reload)))
        try:
            for key, listen, app in listeners:
                runner = Runner(app, handler_cancellation=True, access_log=None,
                                shutdown_timeout=cfg.drain_timeout_s, keepalive_timeout=cfg.keepalive_timeout_s)
                await runner.setup()
                self._runners.append(runner)
                host, port = split_listen(listen)
                shared = self.process is not None and key == "listen"
                if self.process is not None and key != "listen" and port:
                    port += self.process
                    listen = f"{listen.rpartition(':')[0]}:{port}"
                site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=shared or None)
                try:
                    await site.start()
                except OSError as exc:  # asyncio's message repeats the address: the errno's text is enough
                    why = os.strerror(exc.errno).lower() if exc.errno else str(exc)
                    raise UsageError(f"{key} {listen}: {why}") from None
                self.addresses[key] = f"{host}:{runner.addresses[-1][1]}"  # port 0: the one picked
                self.gw.fleet.own.append((host, runner.addresses[-1][1]))
            await self.gw.start()
        except BaseException:
            await self.stop()
            raise

    async def reload(self) -> dict[str, object]:
        """Read the config file again and apply it, or keep the running config whole (UsageError saying why).
        Logged either way; one reload at a time."""
        assert self.config is not None
        async with self._reloading:
            try:
                cfg = await asyncio.to_thread(load, self.config)
                outcome = await self.gw.reload(cfg)
            except UsageError as exc:
                log.warning(f"config {self.config} not reloaded, the running config is kept: {exc}",
                            extra={"fields": {"config": str(self.config), "error": str(exc)}})
                raise
        log.info(f"config {self.config} reloaded: {', '.join(outcome['changed']) or 'nothing changed'}",
                 extra={"fields": {"config": str(self.config), **outcome}})
        return {"reloaded": True, **outcome}

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()  # stops accepting, lets handlers finish within shutdown_timeout
        self._runners.clear()
        await self.gw.stop()
