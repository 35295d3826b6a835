"""``cacheon demo``: simulated workers + the gateway; rr vs approx vs exact on a shared-prefix workload."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cacheon.commands._args import non_negative_int, positive_int
from cacheon.commands._output import print_json
from cacheon.commands._progress import Progress
from cacheon.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run SIMULATED workers and the gateway; compare rr, approx, exact",
                       description="Starts N simulated SGLang workers (a simulator: fake completions, real prefix "
                       "cache and KV events) and the gateway, replays multi-turn chat sessions over per-session "
                       "documents (a few shared system prompts) in turn-synchronised waves under each policy, and "
                       "prints hit rate, load spread and routing decisions by reason.")
    p.add_argument("--workers", type=positive_int, default=4, help="simulated SGLang workers behind the gateway")
    p.add_argument("--sessions", type=positive_int, default=12, help="multi-turn chat sessions replayed")
    p.add_argument("--turns", type=positive_int, default=4, help="turns per session")
    p.add_argument("--arrivals", type=non_negative_int, default=0,
                   help="new sessions per wave (0: all start at once)")
    p.add_argument("--sglang-version", default="0.5.13.post1",
                   help="the release whose KV-event wire (and publisher code) the workers use")
    p.add_argument("--page-size", type=positive_int, default=4, help="tokens per KV page (block)")
    p.add_argument("--capacity-tokens", type=positive_int, default=1 << 16, help="each worker's KV cache size")
    p.add_argument("--delay-ms", type=non_negative_int, default=50, help="simulated time per request")
    p.add_argument("--releases-dir", type=Path, help="where the simulator's SGLang releases are unpacked; the one "
                   "needed is installed there if missing (default: $SGLANG_RELEASES_DIR, else ./.sglang in a checkout, "
                   "else ~/.cache/cacheon/sglang-releases)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="draws the workload (documents, system "
                   "prompts, arrivals, send order); printed, so a run's workload can be replayed. Concurrent "
                   "requests still race, so the numbers vary a little between runs of one seed")
    p.add_argument("--json", action="store_true", help="print each policy's hit rate, load and decisions as JSON")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from cacheon.kv.contracts import for_version
    from cacheon.sim.demo import demo
    from cacheon.sim.releases import default_dir, install, unpacked

    for_version(args.sglang_version)
    if args.capacity_tokens < args.page_size:
        raise UsageError(f"--capacity-tokens {args.capacity_tokens} holds no page of {args.page_size} tokens")
    root = args.releases_dir or default_dir()
    if not unpacked(root, args.sglang_version):
        print(f"installing SGLang {args.sglang_version}'s publisher code into {root} (once)", file=sys.stderr,
              flush=True)
        install(root, args.sglang_version)
    with Progress(f"demo: {args.workers} simulated workers and the gateway under rr, approx and exact",
                  quiet=args.json):
        outcomes = demo(args.workers, args.sessions, args.turns, args.sglang_version, args.page_size,
                        args.capacity_tokens, args.delay_ms, arrivals=args.arrivals, releases=root, seed=args.seed)
    if args.json:
        fields = ("policy", "hit_rate", "load", "reasons", "spread")
        print_json([{**{k: getattr(o, k) for k in fields}, "seed": args.seed} for o in outcomes])
        return 0
    print(f"{'policy':<8} {'hit rate':>8} {'max/mean load':>14}  requests per worker / decisions")
    for o in outcomes:
        load = " ".join(f"{k}={v}" for k, v in o.load.items())
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(o.reasons.items()))
        print(f"{o.policy:<8} {o.hit_rate:>8.3f} {o.spread:>14.2f}  {load} / {reasons}")
    print(f"seed {args.seed} (--seed {args.seed} replays this workload; concurrent requests still race, so the "
          "numbers vary a little)")
    return 0
