"""A candidate child process behind a pipe, with timeouts that kill rather than wait forever."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import tempfile
from pathlib import Path
from typing import Any

from cacheon.bundle.manifest import OpEntry
from cacheon.verify import channel, child
from cacheon.verify.sandbox import Limits

MAX_MESSAGE_BYTES = 1 << 31


class ChildFailure(Exception):
    """The candidate's process misbehaved: it hung (``timeout``), died (``crashed``) or failed to import."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(kind, detail)
        self.kind = kind
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


class CandidateProcess:
    """One spawned child serving one op entry; every exchange is bounded by ``timeout`` seconds."""

    def __init__(
        self, bundle_dir: Path, op: OpEntry, device: str, timeout: float, limits: Limits, rank: dict | None = None
    ) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_end = ctx.Pipe(duplex=True)
        self._logdir = tempfile.TemporaryDirectory(prefix="cacheon-log-")
        self.log_path = Path(self._logdir.name) / "candidate.log"
        setup = {"log": str(self.log_path), "limits": limits, **(rank or {})}
        self._proc = ctx.Process(
            target=child.serve,
            args=(child_end, str(Path(bundle_dir).resolve()), op, device, setup),
            name=f"cacheon-candidate-{op.slot}",
        )
        self._timeout = timeout
        self.isolation: dict[str, Any] = {}
        self._proc.start()
        child_end.close()

    def __enter__(self) -> CandidateProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_ready(self, timeout: float) -> None:
        kind, payload = self.receive(timeout)
        if kind != "ready":
            raise ChildFailure("import_error", str(payload))
        self.isolation = payload if isinstance(payload, dict) else {}

    def request(self, kind: str, message: dict[str, Any]) -> tuple[str, Any]:
        self.send(kind, message)
        return self.receive(self._timeout)

    def send(self, kind: str, message: dict[str, Any]) -> None:
        try:
            self._conn.send_bytes(channel.encode([kind, message]))
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise ChildFailure("crashed", self._exit_description()) from None

    def output_tail(self, limit: int = 4000) -> str:
        """What the candidate printed (untrusted text, for the report only)."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", "replace")

    def receive(self, timeout: float | None = None) -> tuple[str, Any]:
        timeout = self._timeout if timeout is None else timeout
        try:
            if not self._conn.poll(timeout):
                self.kill()
                raise ChildFailure("timeout", f"no answer within {timeout:g}s; the candidate process was killed")
            reply = channel.decode(self._conn.recv_bytes(maxlength=MAX_MESSAGE_BYTES))
        except (EOFError, ConnectionResetError, BrokenPipeError):
            raise ChildFailure("crashed", self._exit_description()) from None
        except (channel.ChannelError, OSError) as exc:
            self.kill()
            raise ChildFailure("protocol", f"the candidate process sent an invalid message ({exc})") from None
        if not (isinstance(reply, list) and len(reply) == 2 and isinstance(reply[0], str)):
            self.kill()
            raise ChildFailure("protocol", "the candidate process sent a message of the wrong shape")
        return reply[0], reply[1]

    def _exit_description(self) -> str:
        self._proc.join(5)
        code = self._proc.exitcode
        if code is None:
            self.kill()
            return "the candidate process stopped answering"
        if code < 0:
            return f"the candidate process died from signal {signal.Signals(-code).name}"
        return f"the candidate process exited with code {code}"

    def kill(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(5)

    def close(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError, OSError):
                self._conn.send_bytes(channel.encode(["stop", {}]))
            self._proc.join(5)
        self.kill()
        self._conn.close()
        self._logdir.cleanup()
