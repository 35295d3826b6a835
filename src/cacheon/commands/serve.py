"""``cacheon serve``: the pinned SGLang server with a candidate's bundle armed, inside the verify sandbox."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from cacheon.commands._args import port, positive_float
from cacheon.commands._output import print_json
from cacheon.errors import UsageError

DESCRIPTION = (
    "Start `python -m sglang.launch_server` from a server venv with BUNDLE armed (the sglang.srt.plugins entry "
    "point), inside the sandbox `cacheon verify` uses: new user, PID, network, IPC, UTS and mount namespaces, no "
    "capabilities, read-only binds of only the venv, its interpreter, cacheon, the model and a private copy of the "
    "admitted bundle, private tmpfs for /tmp and /dev/shm, per-process and aggregate limits. The HTTP port and the "
    "KV publisher's event and replay ports are relayed to this host's 127.0.0.1 on the same numbers; nothing else "
    "is reachable from inside. Flags after `--` go to SGLang (device, attention backend, page size, ...). Prints one "
    "JSON line (addresses, bundle digest, the confinement) once /health answers, then serves until SIGTERM or "
    "Ctrl-C. --confinement none runs it unconfined, and says so."
)


def register(sub: argparse._SubParsersAction) -> None:
    from cacheon.verify.plan import Confinement

    p = sub.add_parser("serve", help="serve SGLang with a bundle armed, confined as verify confines candidates",
                       description=DESCRIPTION)
    p.add_argument("--engine", type=Path, required=True, metavar="PYTHON",
                   help="the server venv's interpreter (e.g. .engines/0.5.13.post1/bin/python)")
    p.add_argument("--model", type=Path, required=True, help="model directory (world-readable when run as root)")
    p.add_argument("--bundle", type=Path, help="bundle to arm (scan must admit it); none serves stock SGLang")
    p.add_argument("--port", type=port, default=30000, help="HTTP port")
    p.add_argument("--kv-port", type=port, default=5557, help="KV-event publisher port")
    p.add_argument("--replay-port", type=port, default=5558, help="KV-event replay port")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda binds /dev/nvidia* and nothing else")
    p.add_argument("--confinement", choices=[c.value for c in Confinement], default=Confinement.BUBBLEWRAP.value,
                   help="none: run the candidate's engine as a plain process of this host (marked UNCONFINED)")
    p.add_argument("--memory-gib", type=positive_float, default=8.0,
                   help="resident memory of the whole sandbox; past it the server is stopped")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set in the server's environment (nothing else of this one is passed; repeatable)")
    p.add_argument("--boot-timeout", type=positive_float, default=300.0, help="seconds to wait for /health")
    p.add_argument("server_args", nargs=argparse.REMAINDER, metavar="-- SGLANG_FLAG ...",
                   help="passed to sglang.launch_server (not --host, --port, --model-path, --kv-events-config)")
    p.set_defaults(handler=_serve)


def _env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def _serve(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from cacheon.serving.confined import Ports, ServeLimits, ServeRequest, served
    from cacheon.verify.plan import Confinement
    from cacheon.verify.sandbox import require_bubblewrap

    confinement = Confinement(args.confinement)
    if confinement is Confinement.BUBBLEWRAP:
        require_bubblewrap()
    else:
        print("cacheon serve: UNCONFINED (--confinement none): the armed kernel runs with this host's files, "
              "network and credentials in reach", file=sys.stderr, flush=True)
    flags = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
    limits = replace(ServeLimits.for_device(args.device), memory_bytes=int(args.memory_gib * (1 << 30)))
    request = ServeRequest(args.engine, args.model, args.bundle, Ports(args.port, args.kv_port, args.replay_port),
                           tuple(flags), _env(args.env), args.device, confinement, limits)
    server = served(request, boot_timeout_s=args.boot_timeout)
    try:
        print_json({"url": server.url, "kv_endpoint": server.kv_endpoint, "replay_endpoint": server.replay_endpoint,
                    "bundle_digest": server.digest, **server.describe()}, line=True)
        sys.stdout.flush()
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        while not stop.wait(1.0) and server.alive():
            pass
        if not stop.is_set():
            print(f"cacheon serve: the server exited ({server.stopped_for or 'its log follows'}):\n{server.log_tail()}",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        server.close()
