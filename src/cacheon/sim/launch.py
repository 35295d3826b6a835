"""Start simulated SGLang workers and the gateway as real processes on 127.0.0.1 (demo, tests, benchmarks)."""

from __future__ import annotations

import functools
import json
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from cacheon.sim.releases import default_dir
from cacheon.sim.tokenizer import gateway_model

T = TypeVar("T")

WAIT_S = 60.0  # generous: a loaded 2-core box
RELEASES = default_dir().resolve()  # resolved once, absolute: the processes may run elsewhere


class ProcessError(RuntimeError):
    """A simulator or gateway process died or never came up."""


_HANDED_OUT: set[int] = set()  # ports given to a process that may not have bound them yet


def free_port() -> int:
    """A free port not handed out before in this process (the kernel may offer a just-closed one again)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def free_range(n: int) -> int:
    """``n`` consecutive free ports below Linux's ephemeral range (ZMQ binds them by number).

    A port is free only if it binds on every address (ZMQ binds ``*``) and was not handed out
    already in this process: a simulator started a moment ago may not have bound its ports yet.
    """
    for _ in range(100):
        base = random.randrange(20000, 32000 - n)
        ports = range(base, base + n)
        if _HANDED_OUT.intersection(ports):
            continue
        socks = []
        try:
            for p in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("", p))
            _HANDED_OUT.update(ports)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def spawn(stack: ExitStack, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``python -m cacheon *args`` as a process, its output into ``log``; stopped when ``stack`` closes
    (SIGTERM, then SIGKILL after 10 s)."""
    out = stack.enter_context(log.open("wb"))
    proc = subprocess.Popen([sys.executable, "-m", "cacheon", *args], stdout=out, stderr=subprocess.STDOUT)

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    stack.callback(stop)
    return proc


def wait_until(check: Callable[[], T | None], what: str, timeout_s: float = WAIT_S) -> T:
    """Poll ``check`` until it returns something truthy (an HTTP error counts as not yet), and return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = check()
        except httpx.HTTPError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise ProcessError(f"timed out waiting for {what}")
        time.sleep(0.1)


class SimProcess:
    """One simulated worker as a real process."""

    def __init__(self, stack: ExitStack, tmp: Path, profile: tuple[Path, Path], version: str, *,
                 page_size: int = 4, dp_size: int = 1, delay_ms: int = 0, fault: str | None = None,
                 model: str = "demo", capacity_tokens: int = 1 << 16, releases: Path = RELEASES,
                 ports: tuple[int, int] | None = None, replay: bool = False,
                 extra_args: Sequence[str] = ()) -> None:
        self.port, self.kv_port = ports or (free_port(), free_range(dp_size))
        self.replay_port = free_range(dp_size) if replay else None
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / f"sim-{self.port}.log"
        args = ["sim", "worker", "--port", str(self.port), "--kv-port", str(self.kv_port), "--sglang-version",
                version, "--releases-dir", str(releases), "--capacity-tokens", str(capacity_tokens),
                "--page-size", str(page_size), "--dp-size", str(dp_size),
                "--model", model, "--tokenizer", str(profile[0]), "--chat-template", str(profile[1]),
                "--bos-token", "<s>", "--delay-ms", str(delay_ms)]
        args += ["--fault", fault] if fault else []
        args += ["--kv-replay-port", str(self.replay_port)] if self.replay_port else []
        self.proc = spawn(stack, [*args, *extra_args], self.log)  # extra: e.g. the time model's flags

    def ready(self) -> None:
        wait_until(lambda: self._up(), f"sim {self.url} (log {self.log})")

    def stats(self) -> dict[str, float]:
        """The simulator's counters: requests completed and aborted (the client left), prompt and cached
        tokens, simulated seconds queued and in prefill."""
        stats: dict[str, float] = httpx.get(f"{self.url}/sim/stats", timeout=5).json()
        return stats

    def requests(self) -> list[dict[str, float]]:
        """The latest admitted requests' simulated schedules (prompt and cached tokens, seconds queued,
        in prefill, per output token), in admission order."""
        requests: list[dict[str, float]] = httpx.get(f"{self.url}/sim/requests", timeout=5).json()["requests"]
        return requests

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise ProcessError(f"sim exited: {self.log.read_text()}")
        return httpx.get(f"{self.url}/health", timeout=2).status_code == 200


class GatewayProcess:
    """One gateway as a real process (``cacheon gateway serve``), configured from arguments."""

    def __init__(self, stack: ExitStack, tmp: Path, profile: tuple[Path, Path] | None, policy: str,
                 workers: list[dict[str, Any]], processes: int = 1, **extra: Any) -> None:
        """``profile``: the simulator's model files, served as ``demo``; None when ``extra`` has ``models``.
        ``processes``: ``serve --processes`` (the config must then name an event plane sharing load)."""
        self.port, self.admin_port = free_port(), free_range(processes)  # process i's admin port: admin + i
        self.url = f"http://127.0.0.1:{self.port}"
        # the admin API's own listener, one a process (process i's on the admin port + i)
        self.admin_urls = [f"http://127.0.0.1:{self.admin_port + i}" for i in range(processes)]
        self.admin_url = self.admin_urls[0]
        models = {"demo": gateway_model(*profile)} if profile is not None else {}
        cfg = {"listen": f"127.0.0.1:{self.port}", "policy": policy, "workers": workers, "models": models,
               "admin": {"listen": f"127.0.0.1:{self.admin_port}"}, "health_interval_s": 0.5,
               "challenge_timeout_s": 5, **extra}
        self.config = path = tmp / f"gateway-{self.port}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.log = tmp / f"gateway-{self.port}.log"
        self.proc = spawn(stack, ["gateway", "serve", "--config", str(path), "--processes", str(processes)], self.log)
        wait_until(self._up, f"gateway (log {self.log})")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise ProcessError(f"gateway exited: {self.log.read_text()}")
        return httpx.get(f"{self.url}/status", timeout=2).status_code == 200

    def status(self, process: int = 0) -> dict[str, dict[str, Any]]:
        """Every worker's full status, by URL (the admin listener's ``/status``: the traffic port's has no URLs)."""
        return {w["url"]: w for w in httpx.get(f"{self.admin_urls[process]}/status", timeout=5).json()["workers"]}

    def wait_discovered(self, urls: list[str]) -> dict[str, dict[str, Any]]:
        """Wait until the gateway knows what model each worker serves (rr and approx discover too)."""
        def done() -> dict[str, dict[str, Any]] | None:
            s = self.status()
            return s if all(u in s and s[u]["model"] for u in urls) else None

        return wait_until(done, f"workers to be discovered: {json.dumps(self.status())[:2000]}")

    def settled(self, urls: list[str]) -> dict[str, dict[str, Any]]:
        """Wait until every worker is READY or FENCED with a reason in every process (each attests on its
        own), and return the first process's status."""
        def done(process: int) -> dict[str, dict[str, Any]] | None:
            s = self.status(process)
            ok = all(u in s and (s[u]["ladder"]["state"] == "READY" or s[u]["ladder"]["reason"]) for u in urls)
            return s if ok else None

        settled = [wait_until(functools.partial(done, p), f"ladder to settle in process {p} (log {self.log})")
                   for p in range(len(self.admin_urls))]
        return settled[0]
