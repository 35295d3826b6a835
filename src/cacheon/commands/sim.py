"""``cacheon sim worker``: a simulated SGLang worker (a simulator, not an engine) for demos and tests.

``cacheon sim profile`` writes the worker's built-in tokenizer profile for a gateway to load.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from cacheon.commands._args import MAX_PORT, non_negative_float, non_negative_int, port, positive_int
from cacheon.commands._output import add_subcommands
from cacheon.errors import UsageError
from cacheon.sim.tokenizer import BOS_TOKEN

if TYPE_CHECKING:
    from cacheon.tokens.profile import TokenizerProfile

DEFAULT_MODEL = "sim-model"
RELEASES_HELP = ("where the SGLang releases are unpacked (default: $SGLANG_RELEASES_DIR, else ./.sglang in a "
                 "checkout, else ~/.cache/cacheon/sglang-releases)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim",
        help="SIMULATED SGLang workers for demos and tests (no model, no GPU)",
        description="A simulator of an SGLang worker: SGLang's HTTP endpoints with a deterministic fake "
        "completion, a real prefix cache, and KV events published by the chosen release's own publisher code.",
    )
    sim = add_subcommands(p, "sim_command")
    w = sim.add_parser("worker", help="serve one simulated worker (SIMULATOR: fake completions)")
    w.add_argument("--port", type=port, required=True, help="HTTP port")
    w.add_argument("--host", default="127.0.0.1", help="HTTP address to bind")
    w.add_argument("--kv-port", type=port, required=True, help="KV-event PUB port of DP rank 0 (rank r: +r)")
    w.add_argument("--kv-replay-port", type=port, help="replay ROUTER port of rank 0 (rank r: +r)")
    w.add_argument("--sglang-version", required=True, help="the release whose wire (and publisher code) to use")
    w.add_argument("--releases-dir", type=Path, help=RELEASES_HELP)
    w.add_argument("--page-size", type=positive_int, default=1, help="tokens per KV page (SGLang's --page-size)")
    w.add_argument("--dp-size", type=positive_int, default=1, help="data-parallel ranks, each publishing its events")
    w.add_argument("--capacity-tokens", type=positive_int, default=1 << 16, help="the KV cache size in tokens")
    w.add_argument("--model", default=DEFAULT_MODEL, help="served model name (default: %(default)s)")
    w.add_argument("--tokenizer", type=Path,
                   help="tokenizer.json (default: the built-in demo tokenizer, with its chat template and BOS "
                   f"{BOS_TOKEN}; `cacheon sim profile --out DIR` writes the same files for a gateway)")
    w.add_argument("--chat-template", type=Path, help="Jinja chat template (without --tokenizer: the built-in one)")
    w.add_argument("--bos-token", help=f"BOS token text (without --tokenizer: {BOS_TOKEN})")
    w.add_argument("--completions-bos", action="store_true", help="prepend BOS on /v1/completions, as some models do")
    w.add_argument("--prefix-cache", choices=("builtin", "sglang"), default="builtin",
                   help="builtin LRU radix cache, or the pinned SGLang's own RadixCache (imports torch: slow start)")
    w.add_argument("--delay-ms", type=non_negative_float, default=0.0,
                   help="a flat simulated time per request, spread over its output tokens")
    w.add_argument("--prefill-us-per-token", type=non_negative_float, default=0.0,
                   help="simulated prefill time per prompt token not already cached, one prefill at a time "
                   "per DP rank")
    w.add_argument("--decode-ms-per-token", type=non_negative_float, default=0.0,
                   help="simulated decode time per output token of each sequence")
    w.add_argument("--max-running-requests", type=non_negative_int, default=0,
                   help="sequences a DP rank runs at once; later arrivals queue in order (0: no bound)")
    w.add_argument("--fault", help="lie in one way: " + ", ".join(_faults()))
    w.set_defaults(handler=_worker)
    ins = sim.add_parser("install-releases", help="unpack SGLang releases' wheels for the simulator's publishers",
                         description="Unpack each VERSION's sglang wheel (alone, no dependencies: the simulator "
                         "loads only its KV-event publisher) into the releases directory. Idempotent.")
    ins.add_argument("versions", nargs="*", metavar="VERSION", help="default: every release with a wire contract")
    ins.add_argument("--releases-dir", type=Path, help=RELEASES_HELP)
    ins.set_defaults(handler=_install)
    pr = sim.add_parser("profile", help="write the built-in tokenizer profile and print its gateway config (YAML)",
                        description="Writes the simulated worker's built-in tokenizer.json and template.jinja "
                        "(byte-identical in every process) and prints the models entry a gateway config needs "
                        "to tokenize as a worker started without --tokenizer does.")
    pr.add_argument("--out", type=Path, required=True, help="directory for tokenizer.json and template.jinja")
    pr.add_argument("--model", default=DEFAULT_MODEL, help="model name the workers serve (default: %(default)s)")
    pr.set_defaults(handler=_profile)


def _install(args: argparse.Namespace) -> int:
    from cacheon.kv.contracts import INTEROP_RELEASES, for_version
    from cacheon.sim.releases import default_dir, install

    root = args.releases_dir or default_dir()
    for version in args.versions or INTEROP_RELEASES:
        for_version(version)  # only releases with a known wire
        print(f"SGLang {version}: {install(root, version)}", flush=True)
    return 0


def _profile(args: argparse.Namespace) -> int:
    import yaml

    from cacheon.sim.tokenizer import gateway_model, write_profile

    try:
        tokenizer, template = write_profile(args.out)
    except OSError as exc:
        raise UsageError(f"cannot write the profile to {args.out}: {exc.strerror}") from None
    print(yaml.safe_dump({"models": {args.model: gateway_model(tokenizer, template)}}, sort_keys=False), end="")
    return 0


def _load_profile(args: argparse.Namespace) -> TokenizerProfile:
    """The worker's tokenizer profile: the given files, or the built-in one (trained into a temp dir, loaded)."""
    from cacheon.sim.tokenizer import write_profile
    from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

    if args.tokenizer is not None:
        return TokenizerProfile(TokenizerSpec(args.tokenizer, args.chat_template, args.completions_bos, args.bos_token))
    with tempfile.TemporaryDirectory(prefix="cacheon-sim-profile-") as tmp:
        tokenizer, template = write_profile(Path(tmp))
        spec = TokenizerSpec(tokenizer, args.chat_template or template, args.completions_bos,
                             args.bos_token or BOS_TOKEN)
        return TokenizerProfile(spec)  # reads both files now: the directory can go


def _faults() -> tuple[str, ...]:
    from cacheon.sim.worker import FAULTS

    return FAULTS


def _worker(args: argparse.Namespace) -> int:
    import uvicorn
    import zmq

    from cacheon.kv.contracts import for_version
    from cacheon.sim.publisher import RankPublishers, load_release_kv_events
    from cacheon.sim.schedule import TimeModel
    from cacheon.sim.worker import FAULTS, SimSettings, SimWorker, build_app

    for_version(args.sglang_version)  # only releases with a known wire
    if args.fault is not None and args.fault not in FAULTS:
        raise UsageError(f"unknown fault {args.fault!r} (known: {', '.join(FAULTS)})")
    if args.capacity_tokens < args.page_size:
        raise UsageError(f"--capacity-tokens {args.capacity_tokens} holds no page of {args.page_size} tokens")
    top = max(args.kv_port, args.kv_replay_port or 0) + args.dp_size - 1
    if top > MAX_PORT:
        raise UsageError(f"--dp-size {args.dp_size}: the last rank's KV port would be {top}, above {MAX_PORT}")
    try:
        time_model = TimeModel(args.prefill_us_per_token / 1e6, args.decode_ms_per_token / 1e3,
                               args.max_running_requests, args.delay_ms / 1e3)
    except ValueError as exc:
        raise UsageError(f"--delay-ms, --prefill-us-per-token, --decode-ms-per-token, --max-running-requests: "
                         f"{exc}") from None
    profile = _load_profile(args)
    settings = SimSettings(
        args.model, args.sglang_version, args.page_size, args.dp_size, args.kv_port, args.capacity_tokens,
        time_model, args.fault, args.kv_replay_port,
    )
    cache = None
    if args.prefix_cache == "sglang":
        from cacheon.sim.radix import SglangPrefixCache

        cache = SglangPrefixCache
    from cacheon.sim.releases import default_dir

    kv = load_release_kv_events(args.releases_dir or default_dir(), args.sglang_version)
    listener = _bind(args.host, args.port)  # before the publishers: either in use is one line, no banner
    try:
        publishers = RankPublishers(kv, args.sglang_version, settings.kv_events_config, args.dp_size)
    except zmq.ZMQError as exc:
        listener.close()
        raise UsageError(f"--kv-port {args.kv_port} (or a rank above it): {exc.strerror}") from None
    try:
        sim = SimWorker(settings, profile, publishers, cache)
    except ValueError as exc:
        publishers.close()
        raise UsageError(str(exc)) from None
    print(f"SIMULATED SGLang {args.sglang_version} worker on http://{args.host}:{args.port} "
          f"(tokenizer sha256 {profile.tokenizer_sha256})", flush=True)
    server = uvicorn.Server(uvicorn.Config(build_app(sim), log_level="warning", access_log=False))
    server.run(sockets=[listener])
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """The HTTP listening socket, bound now so a port in use is a one-line error."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise UsageError(f"--port {port}: {os.strerror(exc.errno) if exc.errno else exc}") from None
    return listener
