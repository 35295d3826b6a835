"""``cacheon sim worker``: a simulated SGLang worker (a simulator, not an engine) for demos and tests."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cacheon.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim",
        help="SIMULATED SGLang workers for demos and tests (no model, no GPU)",
        description="A simulator of an SGLang worker: SGLang's HTTP endpoints with a deterministic fake "
        "completion, a real prefix cache, and KV events published by the chosen release's own publisher code.",
    )
    sim = p.add_subparsers(dest="sim_command", metavar="SUBCOMMAND", parser_class=type(p))
    p.set_defaults(handler=lambda _a: (p.print_help(), 1)[1])
    w = sim.add_parser("worker", help="serve one simulated worker (SIMULATOR: fake completions)")
    w.add_argument("--port", type=int, required=True, help="HTTP port")
    w.add_argument("--host", default="127.0.0.1")
    w.add_argument("--kv-port", type=int, required=True, help="KV-event PUB port of DP rank 0 (rank r: +r)")
    w.add_argument("--kv-replay-port", type=int, help="replay ROUTER port of rank 0 (rank r: +r)")
    w.add_argument("--sglang-version", required=True, help="the release whose wire (and publisher code) to use")
    w.add_argument("--releases-dir", type=Path, default=Path(os.environ.get("SGLANG_RELEASES_DIR", ".sglang")))
    w.add_argument("--page-size", type=int, default=1)
    w.add_argument("--dp-size", type=int, default=1)
    w.add_argument("--capacity-tokens", type=int, default=1 << 16)
    w.add_argument("--model", default="sim-model")
    w.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json")
    w.add_argument("--chat-template", type=Path, help="Jinja chat template")
    w.add_argument("--bos-token", help="BOS token text (needed by --completions-bos)")
    w.add_argument("--completions-bos", action="store_true", help="prepend BOS on /v1/completions, as some models do")
    w.add_argument("--prefix-cache", choices=("builtin", "sglang"), default="builtin",
                   help="builtin LRU radix cache, or the pinned SGLang's own RadixCache (imports torch: slow start)")
    w.add_argument("--delay-ms", type=float, default=0.0, help="simulated time per request")
    w.add_argument("--fault", help="lie in one way: " + ", ".join(_faults()))
    w.set_defaults(handler=_worker)


def _faults() -> tuple[str, ...]:
    from cacheon.sim.worker import FAULTS

    return FAULTS


def _worker(args: argparse.Namespace) -> int:
    import uvicorn

    from cacheon.gateway.contracts import for_version
    from cacheon.gateway.tokenize import Profile, ProfileSpec
    from cacheon.sim.publisher import RankPublishers, load_release_kv_events
    from cacheon.sim.worker import FAULTS, SimSettings, SimWorker, build_app

    for_version(args.sglang_version)  # only releases with a known wire
    if args.fault is not None and args.fault not in FAULTS:
        raise UsageError(f"unknown fault {args.fault!r} (known: {', '.join(FAULTS)})")
    if args.page_size < 1 or args.dp_size < 1 or args.capacity_tokens < args.page_size:
        raise UsageError("need page size >= 1, dp size >= 1 and capacity >= one page")
    profile = Profile(ProfileSpec(args.tokenizer, args.chat_template, args.completions_bos, args.bos_token))
    settings = SimSettings(
        args.model, args.sglang_version, args.page_size, args.dp_size, args.kv_port, args.capacity_tokens,
        args.delay_ms / 1000, args.fault,
    )
    try:
        if args.prefix_cache == "sglang":
            from cacheon.sim.radix import SglangPrefixCache

            sim = SimWorker(settings, profile, None, SglangPrefixCache)
        else:
            sim = SimWorker(settings, profile, None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    kv = load_release_kv_events(args.releases_dir, args.sglang_version)
    sim.publishers = RankPublishers(kv, args.kv_port, args.dp_size, args.kv_replay_port)
    print(f"SIMULATED SGLang {args.sglang_version} worker on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(build_app(sim), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
