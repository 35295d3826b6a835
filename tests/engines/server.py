"""Real SGLang servers on this CPU: the venv per release, the tiny model, the launch, the KV-event feed.

A server is ``python -m sglang.launch_server`` from the release's server venv
(scripts/install_sglang_servers.py), serving a tiny random model made on the spot
(scripts/make_tiny_model.py), with the flags every CPU server needs (``SGLANG_USE_CPU_ENGINE=1``,
``--device cpu --attention-backend torch_native``, ``--max-total-tokens``: without it the KV pool is
sized from host RAM). What differs per release is read from scripts/engines/releases.toml.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import zmq

from cacheon.sim.launch import free_range

REPO = Path(__file__).resolve().parents[2]
RELEASES_TOML = REPO / "scripts" / "engines" / "releases.toml"
MAKE_MODEL = REPO / "scripts" / "make_tiny_model.py"
ENGINES_DIR = Path(os.environ.get("CACHEON_ENGINES_DIR") or REPO / ".engines")
REQUIRE_ENV = "CACHEON_REQUIRE_ENGINES"
INSTALL_HINT = "scripts/install_sglang_servers.py (make engines)"
# Real tokenizers and chat templates (scripts/make_real_vocab.py, run by make engines), one directory each.
VOCAB_DIR = Path(os.environ.get("CACHEON_VOCAB_DIR") or ENGINES_DIR / "vocab")
MAX_TOTAL_TOKENS = 4096
BOOT_TIMEOUT_S = float(os.environ.get("CACHEON_ENGINE_BOOT_TIMEOUT_S", "240"))
TOPIC = "kv"
END_SEQ = b"\xff" * 8  # the replay terminator (seq -1)


def release_table() -> dict[str, dict[str, Any]]:
    return tomllib.loads(RELEASES_TOML.read_text(encoding="utf-8"))["releases"]


RELEASES: tuple[str, ...] = tuple(release_table())


def venv_python(release: str) -> Path:
    return ENGINES_DIR / release / "bin" / "python"


def extensions_dir(release: str) -> Path:
    return ENGINES_DIR / release / "torch_extensions"


def missing_prerequisite(release: str) -> str | None:
    """Why a server for ``release`` cannot start here, or None."""
    python = venv_python(release)
    if not python.exists():
        return f"no server venv for SGLang {release} at {python.parent.parent}; install it with {INSTALL_HINT}"
    if not (python.parent.parent / ".cacheon-engine.json").exists():
        return f"the SGLang {release} server venv at {python.parent.parent} is incomplete; rerun {INSTALL_HINT}"
    return None


def missing_vocab(vocab: str) -> str | None:
    """Why the real tokenizer ``vocab`` is not here, or None."""
    if (VOCAB_DIR / vocab / "tokenizer.json").is_file():
        return None
    return f"no real {vocab} tokenizer at {VOCAB_DIR / vocab}; write it with scripts/make_real_vocab.py (make engines)"


def make_model(release: str, family: str, out: Path, vocab: str | None = None) -> dict[str, Any]:
    """The tiny model, written by the release's own transformers (the version that will load it), on a
    trained tokenizer or on the real one named ``vocab``."""
    real = ["--tokenizer", str(VOCAB_DIR / vocab)] if vocab else []
    done = subprocess.run(
        [str(venv_python(release)), "-W", "ignore", str(MAKE_MODEL), "--family", family, *real, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"make_tiny_model failed for {release}/{family}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class EngineSpec:
    """One server configuration; equal specs share one running server."""

    release: str
    page_size: int
    family: str = "llama"
    bundle: Path | None = None  # armed through the Cacheon plugin ($CACHEON_BUNDLE) when set
    vocab: str | None = None  # a real tokenizer and chat template (VOCAB_DIR) instead of a trained one

    @property
    def label(self) -> str:
        armed = f"+{self.bundle.name}" if self.bundle else ""
        on = f"@{self.vocab}" if self.vocab else ""
        return f"{self.release}/p{self.page_size}/{self.family}{on}{armed}"


class KvFeed:
    """Every frame the server's ZMQ publisher sends, collected by a SUB from before the first request.

    The publisher always binds (``"bind": true`` where the release has the field, a wildcard endpoint
    where it does not: those releases connect to any other), so the SUB connects, and so can any
    other subscriber, a gateway's included.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.endpoint = endpoint
        self.frames: list[tuple[bytes, int, bytes]] = []  # (topic, seq, payload)
        self._sub = ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.connect(endpoint)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kv-feed {endpoint}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(100):
                topic, seq, payload = self._sub.recv_multipart()
                with self._lock:
                    self.frames.append((topic, int.from_bytes(seq, "big"), payload))

    def mark(self) -> int:
        with self._lock:
            return len(self.frames)

    def since(self, mark: int) -> list[tuple[bytes, int, bytes]]:
        with self._lock:
            return self.frames[mark:]

    def wait_quiet(self, mark: int, *, quiet_s: float = 1.0, timeout_s: float = 30.0) -> list[tuple[bytes, int, bytes]]:
        """Frames after ``mark`` once at least one arrived and none came for ``quiet_s``."""
        deadline = time.monotonic() + timeout_s
        count, changed = self.mark(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.mark()
            if now != count:
                count, changed = now, time.monotonic()
            elif now > mark and time.monotonic() - changed >= quiet_s:
                break
        return self.since(mark)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sub.close()


@dataclass
class EngineServer:
    """One running server: its URL, KV feed and replay endpoint, and how it started."""

    spec: EngineSpec
    model: dict[str, Any]
    url: str
    kv_endpoint: str
    replay_endpoint: str
    feed: KvFeed
    process: subprocess.Popen[bytes]
    log_path: Path
    receipt_dir: Path
    command: list[str] = field(default_factory=list)
    startup_s: float = 0.0
    rss_mib: float = 0.0
    restarts: int = 0
    run_frames: int = 0  # where the current process's frames start in ``feed`` (a restart publishes from seq 0)
    env: dict[str, str] = field(default_factory=dict)  # what the launch sets on top of the environment
    ctx: zmq.Context = field(default_factory=zmq.Context.instance)
    replayed: set[int] = field(default_factory=set)

    # -- HTTP ------------------------------------------------------------------------------

    def post(self, path: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{self.spec.label} {path} -> {exc.code}: {exc.read()[:2000]!r}") from None

    def get(self, path: str, timeout: float = 30) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return json.load(response)

    def generate(self, input_ids: list[int], max_new_tokens: int = 1, **extra: Any) -> dict[str, Any]:
        """Greedy ``/generate`` on token ids (the exact tokens the cache will hash)."""
        sampling = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        return self.post("/generate", {"input_ids": input_ids, "sampling_params": sampling, **extra})

    # -- replay ------------------------------------------------------------------------------

    def replay(self, start_seq: int = 0, timeout_s: float = 10.0) -> list[tuple[int, bytes]]:
        """(seq, payload) of every reply from ``start_seq`` to the terminator, either framing
        (``[b"", seq, payload]`` up to 0.5.21, ``[b"", topic, seq, payload]`` from 0.5.22)."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
            replies = []
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if not dealer.poll(200):
                    continue
                frames = dealer.recv_multipart()[1:]
                if END_SEQ in frames and frames[-1] == b"":
                    return replies
                seq, payload = frames[-2:]
                replies.append((int.from_bytes(seq, "big"), payload))
            raise AssertionError(f"{self.spec.label}: replay from {start_seq} did not end within {timeout_s} s")
        finally:
            dealer.close()

    def frames(self) -> list[tuple[int, bytes]]:
        """Every frame published so far, in seq order: the live feed, with any hole it has (a slow
        joiner loses what a publisher sends right after it connects) filled from the replay endpoint,
        as a correct subscriber does. The seqs that came from replay accumulate in ``replayed``."""
        live = {seq: payload for _, seq, payload in self.feed.since(0)}
        if not live:
            return []
        missing = sorted(set(range(max(live) + 1)) - set(live))
        if missing:
            for seq, payload in self.replay(missing[0]):
                if seq in missing:
                    live[seq] = payload
                    self.replayed.add(seq)
        return sorted(live.items())

    # -- lifecycle ----------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGTERM the whole process group (launcher, scheduler, detokenizer), SIGKILL what is left."""
        try:
            pgid = os.getpgid(self.process.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
                if _group_gone(pgid, wait_s):
                    break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def restart(self) -> None:
        """Kill the server and start the same command again, on the same ports (a worker restart as
        an operator or a crash loop causes it). The KV feed stays connected: ZMQ reconnects it."""
        self.kill()
        self.run_frames = self.feed.mark()
        started = time.monotonic()
        self.process = _launch(self.command, self.env, self.log_path)
        _wait_healthy(self, started)
        self.startup_s = time.monotonic() - started
        self.restarts += 1

    def stop(self) -> None:
        self.kill()
        self.feed.close()


def _group_gone(pgid: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


SERVED_MODEL_NAME = "tiny"  # every server, whatever its release: a gateway routes one model over several


def release_env(spec: EngineSpec) -> dict[str, str]:
    """What the release needs in its environment to serve on this CPU."""
    env = {"SGLANG_USE_CPU_ENGINE": "1"}
    if release_table()[spec.release]["allocator_triton_only"] and spec.page_size > 1:
        env["TRITON_INTERPRET"] = "1"
    return env


def serving_flags(spec: EngineSpec) -> list[str]:
    """Every flag but where the server listens, what it loads and where it publishes (also what
    tests/engines/test_confined_serving.py passes to ``cacheon.serving.confined``)."""
    return [
        "--served-model-name", SERVED_MODEL_NAME,
        "--device", "cpu",
        "--attention-backend", "torch_native",
        # dtype "auto" serves a float32 checkpoint as float16; float32 keeps a faithful fp32 kernel exact.
        "--dtype", "float32",
        "--page-size", str(spec.page_size),
        "--max-total-tokens", str(MAX_TOTAL_TOKENS),
        "--enable-cache-report",
        "--random-seed", "0",
        "--skip-server-warmup",
        # An idle scheduler otherwise polls at ~75 % of a core: two live servers took most of a 2-core
        # CI box from the rest of the suite. With it, an idle scheduler waits on its sockets (zmq poll).
        "--sleep-on-idle",
    ]  # fmt: skip


def start_server(spec: EngineSpec, workdir: Path, ctx: zmq.Context, model: dict[str, Any]) -> EngineServer:
    """Launch and wait for ``/health``; a server that dies or hangs fails with its log tail."""
    facts = release_table()[spec.release]
    # Three distinct ports below the ephemeral range (three ``bind(0)`` calls can hand out one port twice, and a
    # port from the ephemeral range can be taken by another test's connection before SGLang binds it); low enough
    # for SGLang's derived gRPC port (+10000).
    port = free_range(3)
    kv_port, replay_port = port + 1, port + 2
    kv_config: dict[str, Any] = {
        "publisher": "zmq",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
        "topic": TOPIC,
    }
    if facts["kv_events_bind_field"]:
        kv_config.update(endpoint=f"tcp://127.0.0.1:{kv_port}", bind=True)
    else:  # these releases bind only a wildcard endpoint (and connect to any other)
        kv_config["endpoint"] = f"tcp://*:{kv_port}"
    feed = KvFeed(ctx, f"tcp://127.0.0.1:{kv_port}")
    receipts = workdir / "receipts"
    receipts.mkdir(parents=True, exist_ok=True)
    # Each venv builds SGLang's native hash extension into its own directory: releases share the
    # extension's name, so a shared torch_extensions directory rebuilds it whenever they alternate.
    env = {**release_env(spec), "PYTHONUNBUFFERED": "1", "TORCH_EXTENSIONS_DIR": str(extensions_dir(spec.release))}
    if spec.bundle is not None:
        env.update(CACHEON_BUNDLE=str(spec.bundle), CACHEON_RECEIPT_DIR=str(receipts))
    command = [
        str(venv_python(spec.release)), "-W", "ignore", "-m", "sglang.launch_server",
        "--model-path", model["path"],
        "--host", "127.0.0.1",
        "--port", str(port),
        "--kv-events-config", json.dumps(kv_config),
        *serving_flags(spec),
    ]  # fmt: skip
    log_path = workdir / "server.log"
    started = time.monotonic()
    server = EngineServer(
        spec, model, f"http://127.0.0.1:{port}", feed.endpoint, kv_config["replay_endpoint"], feed,
        _launch(command, env, log_path), log_path, receipts, command=command, env=env, ctx=ctx,
    )  # fmt: skip
    try:
        _wait_healthy(server, started)
    except BaseException:
        server.stop()
        raise
    server.startup_s = time.monotonic() - started
    server.rss_mib = tree_rss_mib(server.process.pid)
    return server


def _launch(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """The server in a session of its own (so its whole process group can be stopped), logging to
    ``log_path``; ``env`` on top of this process's environment, less any bundle arming of its own."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEON_BUNDLE", "CACHEON_RECEIPT"))}
    with log_path.open("ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**inherited, **env},
                                start_new_session=True, cwd=log_path.parent)


def _wait_healthy(server: EngineServer, started: float) -> None:
    while True:
        if not server.alive():
            raise RuntimeError(f"{server.spec.label} exited with {server.process.returncode}:\n{server.log_tail()}")
        if time.monotonic() - started > BOOT_TIMEOUT_S:
            raise RuntimeError(f"{server.spec.label} not healthy after {BOOT_TIMEOUT_S:.0f} s:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as response:
                healthy = response.status == 200
        except (urllib.error.URLError, OSError):
            healthy = False
        if healthy:
            # A port race with another process would have us talk to a stranger: make sure it is ours.
            info = server.get("/server_info")
            if info.get("model_path") != server.model["path"] or info.get("version") != server.spec.release:
                raise RuntimeError(f"{server.url} answers, but not as {server.spec.label}: {info.get('model_path')}")
            return
        time.sleep(0.5)
