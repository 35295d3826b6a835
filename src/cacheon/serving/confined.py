"""An SGLang server with a candidate's bundle armed, inside the sandbox ``verify`` uses.

The validator's host must not depend on ``scan`` alone while a contributor's kernel serves, so
the whole server (launcher, scheduler, detokenizer, and the armed kernel in them) runs inside the
bubblewrap confinement of :mod:`cacheon.verify.sandbox`: new user, PID, network, IPC, UTS and mount
namespaces, an unprivileged uid, no capabilities, read-only binds of only the server venv and its
interpreter, the ``cacheon`` package, the model directory and a private copy of the admitted
bundle; private size-limited tmpfs for ``/tmp`` (also HOME) and ``/dev/shm``; ``/dev/nvidia*`` on
CUDA only. Limits: per-process address space, a process count, file sizes and open files (rlimits,
set by :mod:`cacheon.serving.confined_init` before the server starts) and an aggregate one: a
watchdog here sums the resident memory of every process in the sandbox's PID namespace and stops
the sandbox past ``memory_bytes`` (this host has no writable cgroup v2).

Network: the sandbox has only loopback. Its HTTP port and the KV publisher's two ports (events,
replay) are published through relays (:mod:`cacheon.serving.relay`) that meet at Unix sockets the
host makes in a directory the sandbox never sees (it inherits the listening descriptors), on the
same port numbers inside and out, because the server reports its KV endpoints in ``/server_info``
and a gateway dials them. Nothing else is reachable from inside. One host directory is writable
from inside: ``/cacheon/run``, where the receipts go.

``Confinement.NONE`` runs the same server as a plain child process: only by explicit request, and
every description of it says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from cacheon.bundle.admission import admit
from cacheon.bundle.snapshot import materialise
from cacheon.errors import CacheonError
from cacheon.runtime.activation import TEST_ONLY_UNSCANNED_ENV
from cacheon.runtime.plugin import BUNDLE_ENV, DIGEST_ENV, RECEIPT_DIR_ENV
from cacheon.serving import relay
from cacheon.serving.confined_init import InitLimits, InitPlan
from cacheon.verify.launcher import ENV_KEEP
from cacheon.verify.plan import Confinement
from cacheon.verify.sandbox import BUNDLE_MOUNT, LIB_MOUNT, SANDBOX_UID, Launch, Mounts, processes_in

MODEL_MOUNT = "/cacheon/model"
RUN_MOUNT = "/cacheon/run"
#: flags this module sets itself (where the server listens, what it loads, where it publishes)
MANAGED_FLAGS = ("--host", "--port", "--model-path", "--kv-events-config")
#: environment serve sets itself: the arming (bundle, digest, receipts, the test-only hook) and which
#: cacheon arms it; an ``--env`` naming one would arm something other than what was admitted
MANAGED_ENV_PREFIX = "CACHEON_"
MANAGED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH")
KV_TOPIC = "kv"
TOPOLOGY = ("/sys/devices/system/cpu", "/sys/devices/system/node")


class ServeError(CacheonError):
    """The confined server cannot be started as asked (exit 1)."""


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on the sandboxed server: ``memory_bytes`` and ``processes`` for the whole tree."""

    memory_bytes: int = 8 << 30  # resident memory of every process in the sandbox, summed
    address_space_bytes: int | None = 16 << 30  # per process; None on CUDA (the driver reserves far more)
    processes: int = 1024  # processes and threads of the sandbox's uid
    file_bytes: int = 1 << 30
    open_files: int = 8192
    tmpfs_bytes: int = 1 << 30  # /tmp, and /dev/shm again

    @classmethod
    def for_device(cls, device: str) -> ServeLimits:
        return cls(address_space_bytes=None) if device == "cuda" else cls()


@dataclass(frozen=True)
class Ports:
    """Where the server listens, inside the sandbox and (the same numbers) on the host's 127.0.0.1."""

    http: int
    kv: int
    replay: int

    def all(self) -> list[int]:
        return [self.http, self.kv, self.replay]


@dataclass(frozen=True)
class ServeRequest:
    python: Path  # the server venv's interpreter (its bin/python)
    model: Path
    bundle: Path | None
    ports: Ports
    server_args: tuple[str, ...] = ()  # device and release flags; MANAGED_FLAGS are refused
    env: Mapping[str, str] = field(default_factory=dict)  # set in the server's environment, nothing else is
    device: str = "cpu"
    confinement: Confinement = Confinement.BUBBLEWRAP
    limits: ServeLimits = field(default_factory=ServeLimits)
    test_only_admit_unscanned: bool = False  # tests/engines' hostile kernels only; see TEST_ONLY_UNSCANNED_ENV


def _venv_facts(python: Path) -> dict[str, str]:
    code = "import json, sys; print(json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix}))"
    try:
        done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise ServeError(f"{python}: cannot run the server interpreter ({exc.strerror})") from None
    if done.returncode != 0:
        raise ServeError(f"{python}: the server interpreter failed: {done.stderr.strip()[-300:]}")
    facts: dict[str, str] = json.loads(done.stdout)
    return facts


def server_mounts(python: Path) -> Mounts:
    """The server venv (bound at its own path, so its ``pyvenv.cfg`` and site-packages work as on the
    host), the interpreter it was made from, and this ``cacheon`` package (first on PYTHONPATH)."""
    facts = _venv_facts(python)
    prefixes = tuple(sorted({os.path.realpath(facts["prefix"]), os.path.realpath(facts["base"])}))
    here = Mounts.of_this_interpreter()
    return Mounts(os.path.realpath(python), prefixes, (), here.package)


def _require_world_readable(model: Path) -> None:
    """Run as root, the sandbox's uid reads the model as "other": say so before a 30 s boot fails."""
    for path in (model, *model.rglob("*")):
        mode = path.stat().st_mode
        need = stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)
        if mode & need != need:
            raise ServeError(f"{path}: not readable by the sandbox's uid {SANDBOX_UID}; "
                             f"make the model world-readable (chmod -R a+rX {model})")


def cpu_topology_binds() -> list[str]:
    """SGLang's CPU path sizes itself from ``lscpu -p`` (NUMA nodes, cores): that one tool and the
    CPU topology it reads, read-only; nothing else of ``/usr/bin`` or ``/sys``."""
    lscpu = shutil.which("lscpu")
    binds = [(os.path.realpath(lscpu), "/usr/bin/lscpu")] if lscpu else []
    binds += [(path, path) for path in TOPOLOGY if os.path.isdir(path)]
    args = []
    for parent in ("/usr/bin", "/sys", "/sys/devices", "/sys/devices/system"):  # bubblewrap would make them 0700
        args += ["--perms", "0755", "--dir", parent]
    for source, dest in binds:
        args += ["--ro-bind", source, dest]
    return args


def kv_events_config(ports: Ports) -> str:
    """A wildcard endpoint (inside the namespace only loopback exists): releases without the ``bind``
    field bind only a wildcard, the later ones are told to bind."""
    return json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{ports.kv}", "bind": True,
                       "replay_endpoint": f"tcp://*:{ports.replay}", "topic": KV_TOPIC})


class ConfinedServer:
    """One server, confined (or, asked explicitly, not). ``start()``, ``wait_healthy()``, ``stop()``."""

    def __init__(self, request: ServeRequest, workdir: Path | None = None) -> None:
        for flag in request.server_args:
            if flag.split("=", 1)[0] in MANAGED_FLAGS:
                raise ServeError(f"{flag.split('=', 1)[0]} is set by cacheon serve itself; leave it out")
        managed = sorted(k for k in request.env if k.startswith(MANAGED_ENV_PREFIX) or k in MANAGED_ENV)
        if managed:
            raise ServeError(f"{managed[0]} is set by cacheon serve itself (the arming, the cacheon that arms); "
                             "leave it out")
        if not request.model.is_dir():
            raise ServeError(f"{request.model}: no such model directory")
        self.request = request
        self.confined = request.confinement is Confinement.BUBBLEWRAP
        self._tmp = tempfile.TemporaryDirectory(prefix="cacheon-serve-", dir=workdir)
        self.root = Path(self._tmp.name)
        self.run_dir = self.root / "run"
        self.receipt_dir = self.run_dir / "receipts"
        self.log_path = self.root / "server.log"
        self.digest: str | None = None
        self.launch: Launch | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped_for: str | None = None  # why the watchdog stopped the sandbox
        self._relays: relay.RelayThread | None = None
        self._sockets: relay.SocketDirectory | None = None
        self._watch = threading.Event()

    # -- addresses -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.request.ports.http}"

    @property
    def kv_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.request.ports.kv}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.request.ports.replay}"

    @property
    def model_path(self) -> str:
        """The model directory as the server names it (``/server_info``)."""
        return MODEL_MOUNT if self.confined else str(self.request.model.resolve())

    # -- the record ------------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What confined the server: for the output and every evidence record made against it."""
        if not self.confined:
            return {"confinement": Confinement.NONE.value,
                    "warning": "UNCONFINED: the candidate's kernel ran with this host's filesystem, network "
                               "and credentials in reach"}
        limits = self.request.limits
        return {
            "confinement": Confinement.BUBBLEWRAP.value,
            "namespaces": ["user", "pid", "net", "ipc", "uts", "mount", "cgroup"],
            "uid": SANDBOX_UID,
            "capabilities": "none",
            "read_only": ["server venv and its interpreter", "cacheon package", "model", "bundle copy"],
            "writable": ["/tmp (tmpfs)", "/dev/shm (tmpfs)", f"{RUN_MOUNT} (receipts)"],
            "network": {"inside": "loopback only", "published": self.request.ports.all()},
            "limits": {"memory_bytes_aggregate": limits.memory_bytes, "address_space_bytes": limits.address_space_bytes,
                       "processes": limits.processes, "file_bytes": limits.file_bytes,
                       "open_files": limits.open_files, "tmpfs_bytes": limits.tmpfs_bytes},
            "devices": "/dev/nvidia*" if self.request.device == "cuda" else "none",
        }

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ConfinedServer:
        request = self.request
        if self.confined and os.geteuid() == 0:
            _require_world_readable(request.model)
        bundle_dir = self._admitted_copy()
        self.run_dir.mkdir(mode=0o700)
        self.receipt_dir.mkdir(mode=0o700)
        self.log_path.touch(mode=0o600)
        env = self._server_env(bundle_dir)
        model = MODEL_MOUNT if self.confined else str(request.model.resolve())
        # the venv's own bin/python (not the interpreter it links to: pyvenv.cfg must apply), by real directory
        python = os.path.join(os.path.realpath(request.python.parent), request.python.name)
        server = [python, "-B", "-W", "ignore", "-m", "sglang.launch_server", "--model-path", model,
                  "--host", "127.0.0.1", "--port", str(request.ports.http),
                  "--kv-events-config", kv_events_config(request.ports), *request.server_args]
        if not self.confined:
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(server, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                stdin=subprocess.DEVNULL, cwd=self.root, start_new_session=True)
            return self
        if os.geteuid() == 0:
            for path in (self.run_dir, self.receipt_dir):
                os.chown(path, SANDBOX_UID, SANDBOX_UID)
        limits = request.limits
        socket_dir = self.root / "relay"  # never bound into the sandbox: it gets the listening descriptors only
        socket_dir.mkdir(mode=0o700)
        sockets = self._sockets = relay.SocketDirectory(socket_dir)
        listening = [relay.listen_unix(sockets.path(p)) for p in request.ports.all()]
        fds = [s.fileno() for s in listening]
        plan = InitPlan(server, request.ports.all(), fds,
                        InitLimits(limits.address_space_bytes, limits.processes, limits.file_bytes, limits.open_files),
                        SANDBOX_UID if os.geteuid() == 0 else None)
        command = [python, "-B", "-m", "cacheon.serving.confined_init", msgspec.json.encode(plan).decode()]
        # /dev/shm is the sandbox's own sized tmpfs (bwrap_argv), as /tmp is
        extra = ["--ro-bind", str(request.model.resolve()), MODEL_MOUNT, "--bind", str(self.run_dir), RUN_MOUNT,
                 *cpu_topology_binds()]
        try:
            self.launch = Launch.start(server_mounts(request.python), str(bundle_dir), request.device,
                                       limits.tmpfs_bytes, command, env, fds, self.log_path, extra)
        finally:
            for sock in listening:  # the sandbox holds them now
                sock.close()
        self.process = self.launch.process
        self._relays = relay.RelayThread(
            lambda: [relay.tcp_to_unix(p, sockets.path(p)) for p in request.ports.all()]
        )
        threading.Thread(target=self._watchdog, name="cacheon-serve-watchdog", daemon=True).start()
        return self

    def _admitted_copy(self) -> Path:
        """Admit the bundle (one snapshot: scan, digest) and write exactly its declared files from the
        snapshot's bytes; what serves is that copy, re-digested."""
        bundle = self.request.bundle
        target = self.root / "bundle"
        if bundle is None:
            target.mkdir(mode=0o755)  # the sandbox binds an empty directory: nothing is armed
            return target
        admission = admit(bundle)
        if admission.digest is None:
            raise ServeError(f"{bundle}: the bundle has no content digest (a link in its tree)")
        if not admission.admitted and not self.request.test_only_admit_unscanned:
            first = admission.scan.findings[0] if admission.scan.findings else "no detail"
            raise ServeError(f"{bundle}: scan did not admit the bundle ({first}); run `cacheon scan` on it")
        materialise(admission.snapshot, admission.manifest.declared_files(), target)  # the admitted bytes
        copied = admit(target).digest
        if copied != admission.digest:
            raise ServeError(f"{bundle}: changed while it was copied ({admission.digest} then {copied})")
        self.digest = admission.digest
        return target

    def _server_env(self, bundle_dir: Path) -> dict[str, str]:
        """Default-deny: the device selection of this environment, and what the request names."""
        tmp = "/tmp" if self.confined else str(self.root / "home")
        if not self.confined:
            os.makedirs(tmp, mode=0o700)
        env = {k: v for k, v in os.environ.items() if k in ENV_KEEP or k.startswith("NVIDIA_")}
        env.update({"PATH": f"{os.path.realpath(self.request.python.parent)}:/usr/bin:/bin", "LANG": "C.UTF-8",
                    "HOME": tmp, "TMPDIR": tmp, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                    "TRITON_CACHE_DIR": f"{tmp}/.triton", "TORCH_EXTENSIONS_DIR": f"{tmp}/torch_extensions",
                    "GLOO_SOCKET_IFNAME": "lo"})
        # the cacheon that admitted the bundle arms it, not whatever the server venv has installed
        env["PYTHONPATH"] = LIB_MOUNT if self.confined else os.path.dirname(Mounts.of_this_interpreter().package)
        env.update(self.request.env)
        if self.request.bundle is not None and self.digest is not None:
            env.update({BUNDLE_ENV: BUNDLE_MOUNT if self.confined else str(bundle_dir), DIGEST_ENV: self.digest,
                        RECEIPT_DIR_ENV: f"{RUN_MOUNT}/receipts" if self.confined else str(self.receipt_dir)})
            if self.request.test_only_admit_unscanned:
                env[TEST_ONLY_UNSCANNED_ENV] = self.digest
        return env

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self, timeout_s: float = 240.0) -> float:
        """Seconds until ``/health`` answered through the relay; a server that died or hung raises."""
        started = time.monotonic()
        while True:
            if not self.alive():
                raise ServeError(f"the server exited ({self.stopped_for or self._exit()}):\n{self.log_tail()}")
            if time.monotonic() - started > timeout_s:
                raise ServeError(f"the server was not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)

    def _exit(self) -> str:
        return f"exit status {self.process.returncode}" if self.process is not None else "never started"

    def sandbox_pids(self) -> list[int]:
        """Host pids of every process in the sandbox (its PID namespace): empty once it is gone."""
        if self.launch is None or self.launch.pid_namespace is None:
            return []
        return processes_in(self.launch.pid_namespace)

    def _watchdog(self) -> None:
        """The aggregate memory bound: past it the whole sandbox is stopped, and ``stopped_for`` says why."""
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._watch.wait(0.5) and self.alive():
            total = 0
            for pid in self.sandbox_pids():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            if total > self.request.limits.memory_bytes:
                self.stopped_for = f"resident memory {total} B past the sandbox's {self.request.limits.memory_bytes} B"
                self._kill()
                return

    def _kill(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        if self.confined:  # bubblewrap's --die-with-parent takes the sandbox's PID namespace with it
            self.process.kill()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)

    def stop(self) -> None:
        self._watch.set()
        if self.process is not None and self.process.poll() is None and not self.confined:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        self._kill()
        deadline = time.monotonic() + 10
        while self.sandbox_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._relays is not None:
            self._relays.close()
            self._relays = None
        if self._sockets is not None:
            self._sockets.close()
            self._sockets = None

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> ConfinedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def served(request: ServeRequest, workdir: Path | None = None, boot_timeout_s: float = 240.0) -> ConfinedServer:
    """Start and wait for ``/health``; on failure nothing is left running."""
    server = ConfinedServer(request, workdir)
    try:
        server.start()
        server.wait_healthy(boot_timeout_s)
    except BaseException:
        server.close()
        raise
    return server
