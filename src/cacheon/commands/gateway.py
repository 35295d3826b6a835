"""``cacheon gateway``: serve the OpenAI-compatible, KV-aware router; check a config file."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path

import msgspec

from cacheon.commands._output import add_subcommands, print_json
from cacheon.errors import UsageError

ENV_HELP = ("Environment variables override config keys: CACHEON_GATEWAY_ and the key's path in capitals, __ between "
            "levels (CACHEON_GATEWAY_POLICY=rr, CACHEON_GATEWAY_ADMIN__TOKEN=...); values are read as YAML.")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="OpenAI-compatible KV-aware router in front of SGLang workers",
                       description="Route OpenAI and SGLang-native requests to SGLang workers: rr, exact or approx.")
    gw = add_subcommands(p, "gateway_command")
    serve = gw.add_parser("serve", help="serve the gateway (traffic and admin listeners)",
                          description="Serve the gateway until SIGTERM or Ctrl-C; SIGHUP reloads the config file "
                          "(validated first; on any error the running config is kept and the log says why). "
                          "Start-up problems (a bad config, an unreadable tokenizer, a port in use) are one line "
                          "on stderr and exit 1 before anything is served. " + ENV_HELP)
    serve.add_argument("--config", type=Path, required=True, help="YAML or TOML config file")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                       help="least severe record logged (default: info: one access line per request)")
    serve.add_argument("--log-format", choices=("text", "json"), default="text",
                       help="text lines, or one JSON object per line (default: text)")
    serve.set_defaults(handler=_serve)
    check = gw.add_parser("check-config", help="validate a config file and its tokenization profiles",
                          description="Validate a config file (with its environment overrides) and load every "
                          "tokenization profile. " + ENV_HELP)
    check.add_argument("config", type=Path, help="YAML or TOML config file")
    check.add_argument("--json", action="store_true",
                       help="print the effective config (overrides applied, admin token redacted) as JSON")
    check.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    from cacheon.gateway.app import admin_token
    from cacheon.gateway.config import load
    from cacheon.gateway.service import load_profiles

    cfg = load(args.config)
    load_profiles(cfg)
    admin_token(cfg)
    if args.json:
        effective = msgspec.to_builtins(cfg, enc_hook=str)  # tokenizer paths (resolved against the file) as text
        if effective["admin"].get("token") is not None:
            effective["admin"]["token"] = "<redacted>"
        print_json({"ok": True, "config": effective})
        return 0
    print(f"ok: policy {cfg.policy}, {len(cfg.workers)} worker(s), {len(cfg.models)} model(s)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from cacheon.gateway.app import GatewayServer
    from cacheon.gateway.config import load
    from cacheon.gateway.heap import freeze_startup_objects
    from cacheon.gateway.logs import configure
    from cacheon.gateway.service import Gateway

    configure(args.log_level, args.log_format)
    cfg = load(args.config)
    server = GatewayServer(Gateway(cfg), args.config)
    freeze_startup_objects()

    async def run() -> None:
        await server.start()
        admin = server.addresses.get("admin.listen")
        print(f"cacheon gateway ({cfg.policy}) on http://{server.addresses['listen']}"
              + (f", admin on http://{admin}" if admin else ", no admin listener"), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        reloads: set[asyncio.Task[None]] = set()

        async def reload_logged() -> None:
            with contextlib.suppress(UsageError):  # logged by reload, the running config kept
                await server.reload()

        def reload() -> None:
            task = loop.create_task(reload_logged())
            reloads.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, reload)
        try:
            await stop.wait()
        finally:
            await server.stop()

    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(run())
    return 0
