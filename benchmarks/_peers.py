"""The peers the benchmarks measure against, each in its own venv under .peers/ (benchmarks/peers/install.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx

from cacheon.sim.launch import free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("PEERS_DIR", ROOT / ".peers"))  # as install.sh reads it


def peer_python(name: str) -> Path:
    python = PEERS / name / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"peer {name} is not installed: run benchmarks/peers/install.sh {name}")
    return python


def dynamo(mode: str, **options: object) -> dict:
    """Run ``peers/dynamo_tree.py MODE`` in Dynamo's venv and return what it printed."""
    argv = [str(peer_python("ai-dynamo-runtime")), str(ROOT / "benchmarks" / "peers" / "dynamo_tree.py"), mode]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the Dynamo side failed (exit {done.returncode}): {' '.join(argv[1:])}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def failed(message: str) -> None:
    """A checked-and-failed benchmark (a cross-check or a workload digest): exit 2, as the CLI does."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


class SglangRouter:
    """SGLang's own router (PyPI ``sglang-router``, its Rust server) in front of ``worker_urls``, on 127.0.0.1.

    It registers each worker's tokenizer from the worker's model path and fetches it from the hub when
    that is no local directory: serve the workers under their tokenizer's directory as model name, or
    it reaches out (this box has no hub; the start-up check refuses a router that tried).
    """

    def __init__(self, stack: ExitStack, tmp: Path, worker_urls: list[str], policy: str,
                 extra_args: list[str] | tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"sglang-router-{self.port}.log"
        argv = [str(peer_python("sglang-router")), "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                "--port", str(self.port), "--worker-urls", *worker_urls, "--policy", policy,
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--log-level", "warn",
                *extra_args]
        out = stack.enter_context(self.log.open("wb"))
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        stack.callback(self._stop)
        wait_until(lambda: self._ready(len(worker_urls)), f"sglang-router (log {self.log})")
        if "huggingface" in self.log.read_text().lower():
            raise SystemExit(f"sglang-router tried to fetch a tokenizer from the hub (log {self.log})")

    def _ready(self, n: int) -> bool:
        if self.proc.poll() is not None:
            raise SystemExit(f"sglang-router exited: {self.log.read_text()[-2000:]}")
        workers = httpx.get(f"{self.url}/workers", timeout=2).json().get("workers", [])
        return len(workers) == n and all(w.get("is_healthy") for w in workers)

    def _stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
