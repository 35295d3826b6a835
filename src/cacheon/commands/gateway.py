"""``cacheon gateway``: serve the OpenAI-compatible, KV-aware router; check a config file."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from cacheon.commands._args import positive_int
from cacheon.commands._output import add_subcommands, print_json
from cacheon.errors import CacheonError, UsageError

if TYPE_CHECKING:
    from cacheon.gateway.config import GatewayConfig

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
    serve.add_argument("--processes", type=positive_int, default=1,
                       help="gateway processes sharing the traffic port (SO_REUSEPORT), each a replica on the "
                       "config's event_plane with share_load (required past 1); process i's admin listener is on "
                       "the admin port + i; SIGHUP and SIGTERM reach them all")
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


def processes_refusal(cfg: GatewayConfig, processes: int) -> str | None:
    """Why ``processes`` gateway processes cannot serve ``cfg``, or None. Several processes on one port are
    replicas, each seeing only the requests the kernel hands it: valid only with load shared between them."""
    from cacheon.gateway.config import split_listen

    if processes == 1:
        return None
    if cfg.event_plane is None or not cfg.event_plane.share_load:
        return (f"--processes {processes} needs event_plane with share_load in the config: each process is a "
                "replica and would see only its own share of the load")
    if cfg.policy != "exact":
        return f"--processes {processes} needs policy exact (the one whose cost model counts the shared load)"
    if split_listen(cfg.listen)[1] == 0:
        return f"--processes {processes} needs a fixed listen port (port 0 would give each process its own)"
    admin = split_listen(cfg.admin.listen)[1] if cfg.admin.listen is not None else 0
    if admin + processes - 1 > 65535:
        return (f"--processes {processes}: the admin ports {admin}-{admin + processes - 1} (one a process) go past "
                "65535; set a lower admin.listen port")
    return None


def _serve(args: argparse.Namespace) -> int:
    from cacheon.gateway.config import load

    if args.processes == 1:
        return _serve_one(args, None)
    refusal = processes_refusal(load(args.config), args.processes)
    if refusal is not None:
        raise UsageError(refusal)
    return _supervise(args)


def _supervise(args: argparse.Namespace) -> int:
    """Start ``--processes`` gateway processes, forward SIGHUP/SIGTERM/SIGINT to them, and stop them all
    when one exits on its own (a start-up error: it said why on stderr)."""
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter each: no event loop or socket inherited
    children = [spawn.Process(target=_child, args=(args, i), name=f"cacheon-gateway-{i}")
                for i in range(args.processes)]
    stopping = False

    def forward(sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = stopping or sig != signal.SIGHUP
        for child in children:
            if child.pid is not None and child.exitcode is None:
                os.kill(child.pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for child in children:
        child.start()
    code = 0
    running: dict[object, BaseProcess] = {child.sentinel: child for child in children}
    while running:
        for ready in multiprocessing.connection.wait([child.sentinel for child in running.values()]):
            done = running.pop(ready)
            done.join()
            if not stopping:
                print(f"cacheon gateway: process {done.name} exited ({done.exitcode}): stopping the others",
                      file=sys.stderr, flush=True)
                forward(signal.SIGTERM, None)
                code = 1
            code = code or (1 if done.exitcode else 0)
    return code


def _child(args: argparse.Namespace, process: int) -> None:
    try:
        code = _serve_one(args, process)
    except CacheonError as exc:
        print(f"cacheon gateway: error: process {process}: {exc}", file=sys.stderr, flush=True)
        code = exc.exit_code
    sys.exit(code)


def _serve_one(args: argparse.Namespace, process: int | None) -> int:
    """One gateway process; ``process``: its index among ``--processes`` (None: the only one)."""
    from cacheon.gateway.app import GatewayServer
    from cacheon.gateway.config import load
    from cacheon.gateway.heap import freeze_startup_objects
    from cacheon.gateway.logs import configure
    from cacheon.gateway.service import Gateway

    configure(args.log_level, args.log_format)
    cfg = load(args.config)
    server = GatewayServer(Gateway(cfg), args.config, process)
    freeze_startup_objects()

    async def run() -> None:
        await server.start()
        admin = server.addresses.get("admin.listen")
        print(f"cacheon gateway ({cfg.policy}) on http://{server.addresses['listen']}"
              + (f", admin on http://{admin}" if admin else ", no admin listener")
              + ("" if process is None else f", process {process} of {args.processes}"), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        parent = multiprocessing.parent_process()
        if process is not None and parent is not None:  # a supervisor killed outright takes its processes along
            loop.add_reader(parent.sentinel, stop.set)
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
