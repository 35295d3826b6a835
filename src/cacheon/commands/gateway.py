"""``cacheon gateway``: serve the OpenAI-compatible, KV-aware router; check a config file."""

from __future__ import annotations

import argparse
from pathlib import Path

from cacheon.commands._output import add_subcommands


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gateway", help="OpenAI-compatible KV-aware router in front of SGLang workers",
                       description="Route OpenAI and SGLang-native requests to SGLang workers: rr, exact or approx.")
    gw = add_subcommands(p, "gateway_command")
    serve = gw.add_parser("serve", help="serve the gateway (uvicorn)")
    serve.add_argument("--config", type=Path, required=True, help="YAML or TOML config file")
    serve.set_defaults(handler=_serve)
    check = gw.add_parser("check-config", help="validate a config file and its tokenization profiles")
    check.add_argument("config", type=Path)
    check.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    from cacheon.gateway.config import load
    from cacheon.tokens.profile import TokenizerProfile

    cfg = load(args.config)
    for spec in cfg.models.values():
        TokenizerProfile(spec)
    print(f"ok: policy {cfg.policy}, {len(cfg.workers)} worker(s), {len(cfg.models)} model(s)")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from cacheon.gateway.app import build_app
    from cacheon.gateway.config import load
    from cacheon.gateway.heap import freeze_startup_objects

    cfg = load(args.config)
    app = build_app(cfg)
    freeze_startup_objects()
    print(f"cacheon gateway ({cfg.policy}) on http://{cfg.host}:{cfg.port}", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False)
    return 0
