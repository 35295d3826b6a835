"""What the sandbox around a confined server stops: a hostile kernel armed in a real pin server on CPU.

tests/engines/hostile/ is a faithful ``silu_and_mul`` whose first call attacks its host: it writes a
host file (and one into the read-only server venv), reads a secret file and this repository's
evidence ledger, connects to a loopback server outside, leaves a process behind in a session of its
own, reserves more memory than the sandbox allows, and (confined only) links over the relay sockets
that carry its ports to the host. ``scan`` refuses it, so it is armed through
the test-only hook (``ServeRequest.test_only_admit_unscanned``). ONE confined server runs every
attack (a start costs 25-50 s here); each must fail while the server keeps answering. The
unconfined control runs the same kernel's ``attack()`` as a plain process of this host (no second
server: the attacks do not depend on SGLang around them), where each must succeed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cacheon.bundle.admission import admit
from cacheon.serving.confined import ServeError, ServeLimits
from tests.engines import confined
from tests.engines.server import REPO, EngineSpec, venv_python

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PIN = "0.5.13.post1"
HOSTILE = Path(__file__).parent / "hostile"
LEDGER = REPO / "records" / "ledger.sqlite3"
MEMORY = 20 << 30  # past the sandbox's 16 GiB address space, below this host's RAM (an untouched reservation)
IDS = [0, 11, 23, 35, 47, 59, 71, 83]


@dataclass
class Host:
    """What the kernel aims at outside the sandbox."""

    root: Path
    secret: Path
    listener: socket.socket
    connections: list[bytes] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def env(self, writes: list[Path]) -> dict[str, str]:
        return {"HOSTILE_WRITE": os.pathsep.join(map(str, writes)),
                "HOSTILE_READ": os.pathsep.join(map(str, (self.secret, LEDGER))),
                "HOSTILE_CONNECT": str(self.port), "HOSTILE_MEMORY": str(MEMORY)}

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self.connections.append(conn.recv(64))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    root = tmp_path_factory.mktemp("host")
    root.chmod(0o777)  # not the permissions: the sandbox is what must stop the write
    secret = root / "secret.key"
    secret.write_text("host secret\n")
    secret.chmod(0o644)
    listener = socket.create_server(("127.0.0.1", 0))
    h = Host(root, secret, listener)
    threading.Thread(target=h.accept, daemon=True).start()
    yield h
    listener.close()


@pytest.fixture(scope="module")
def hostile(engine_pool, host, tmp_path_factory):
    venv_file = venv_python(PIN).parent.parent / "cacheon-hostile-write"
    writes = [host.root / "written-from-the-sandbox", venv_file]
    env = {**host.env(writes), "HOSTILE_HIJACK": "1"}
    engine = confined.start(engine_pool, EngineSpec(PIN, 1, "llama", HOSTILE),
                            tmp_path_factory.mktemp("confined-hostile"), env=env, test_only_admit_unscanned=True)
    try:
        first = engine.generate(IDS, 8)
        report = json.loads((engine.receipt_dir / "hostile.json").read_text())
        yield engine, report, writes, first
    finally:
        engine.close()
        assert not venv_file.exists()


def test_scan_refuses_the_hostile_kernel_so_only_the_test_hook_arms_it() -> None:
    assert not admit(HOSTILE).admitted


def test_every_attack_fails_in_the_sandbox_and_the_server_keeps_answering(hostile, host) -> None:
    engine, report, writes, first = hostile
    for path in writes:
        assert not report[f"write {path}"]["ok"], report
        assert not path.exists()
    for path in (host.secret, LEDGER):
        assert not report[f"read {path}"]["ok"], report
    assert not report["connect"]["ok"] and host.connections == [], report
    assert not report["memory"]["ok"], report
    assert not report["hijack"]["ok"], report  # the relay sockets are not in the sandbox's reach
    assert len(first["output_ids"]) == 8
    again = engine.generate(IDS, 8)
    assert again["output_ids"] == first["output_ids"]  # and still greedy-deterministic


def test_a_process_the_kernel_leaves_behind_dies_with_the_sandbox(hostile) -> None:
    engine, report, *_ = hostile
    assert report["linger"]["ok"], report  # fork is allowed; outliving the sandbox is not
    assert engine.confined.sandbox_pids()
    engine.confined.stop()
    assert engine.confined.sandbox_pids() == []


def test_the_same_kernel_does_each_of_them_unconfined(host, tmp_path) -> None:
    written = host.root / "written-unconfined"
    report_path = tmp_path / "report.json"
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('hostile', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.attack()")
    env = {**os.environ, **host.env([written]), "HOSTILE_REPORT": str(report_path), "HOSTILE_LINGER_S": "60"}
    errors = tmp_path / "stderr"
    with errors.open("wb") as err:  # not a pipe: the lingering grandchild would hold it open for a minute
        done = subprocess.run([sys.executable, "-c", code, str(HOSTILE / "kernels" / "silu_and_mul.py")], env=env,
                              stdout=subprocess.DEVNULL, stderr=err, timeout=120)
    assert done.returncode == 0, errors.read_text()
    report = json.loads(report_path.read_text())
    lingering = int(report["linger"]["detail"]) if report["linger"]["ok"] else None
    try:
        assert all(outcome["ok"] for name, outcome in report.items() if name != "pid"), report
        assert written.read_text() == "written by a kernel\n"
        assert bytes.fromhex(report[f"read {host.secret}"]["detail"]) == b"host secret\n"
        assert bytes.fromhex(report[f"read {LEDGER}"]["detail"]).startswith(b"SQLite format 3")
        assert host.connections == [b"exfiltrated"]
        assert lingering is not None and confined.host_pid_alive(lingering)
    finally:
        if lingering is not None and confined.host_pid_alive(lingering):
            os.kill(lingering, signal.SIGKILL)  # the process this test's kernel started


def test_the_sandbox_is_stopped_when_its_processes_together_pass_the_memory_bound(engine_pool, tmp_path) -> None:
    """The aggregate bound (summed resident memory of the sandbox's PID namespace), cheaply: a bound
    the server's own start-up passes within seconds (python and torch imported: well over 64 MiB)."""
    with pytest.raises(ServeError, match=r"resident memory \d+ B past the sandbox's"):
        confined.start(engine_pool, EngineSpec(PIN, 1), tmp_path, limits=ServeLimits(memory_bytes=64 << 20))
