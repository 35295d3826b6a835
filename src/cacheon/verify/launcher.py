"""The candidate's processes as the parent sees them: one sandbox per op, one channel per rank.

Every rank of a collective runs in the same sandbox (they meet over its loopback), each behind
its own parent-owned socket; a rank sees no other rank's channel. Every read and write of a
channel is bounded by a deadline that kills the whole sandbox rather than wait forever, every
reply by the bytes of what the parent asked for, and the candidate's output by a fixed tail. With
``--confinement none`` the same child runs as a plain process of the verifier, in a private
working directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec

from cacheon.bundle.manifest import OpEntry
from cacheon.bundle.snapshot import Snapshot, materialise
from cacheon.errors import CacheonError
from cacheon.printable import escape_controls
from cacheon.verify import channel
from cacheon.verify.child import BOOTSTRAP
from cacheon.verify.deadline import Deadline, earliest
from cacheon.verify.messages import (
    Boot,
    Booted,
    BootLimits,
    Call,
    Capture,
    FromChild,
    ImportFailed,
    Ready,
    Reply,
    Stop,
    ToChild,
)
from cacheon.verify.output import OutputTail
from cacheon.verify.plan import Confinement, Limits
from cacheon.verify.sandbox import BUNDLE_MOUNT, SANDBOX_UID, WORKDIR, Launch, Mounts
from cacheon.verify.tree_bound import TreeLimits
from cacheon.verify.untrusted import MAX_REASON, escaped, one_line

#: how long a child may take to read the parent's Stop before it is killed anyway
STOP_SECONDS = 1.0
#: host environment variables the child keeps (device selection); everything else is dropped
ENV_KEEP = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "TZ")


class InfrastructureError(CacheonError):
    """The harness itself could not run (exit 1): not the candidate's fault."""


class ChildFailure(Exception):
    """The candidate's process misbehaved: it hung (``timeout``), died (``crashed``), failed to
    import (``import_error``) or broke the protocol (``protocol``). ``reason`` is one line; ``detail``
    (a traceback, when there is one) is shown with --debug only."""

    def __init__(self, kind: str, reason: str, detail: str = "") -> None:
        super().__init__(kind, reason)
        self.kind = kind
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


def _child_env(device: str, workdir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_KEEP or k.startswith("NVIDIA_")}
    env.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir,
                "GLOO_SOCKET_IFNAME": "lo", "TRITON_CACHE_DIR": f"{workdir}/.triton"})
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # Triton kernels run on CPU through the interpreter
    else:
        libcuda = sorted(Path("/usr").glob("lib*/**/libcuda.so.1"))
        if libcuda:  # Triton would otherwise run /sbin/ldconfig, which the sandbox does not have
            env["TRITON_LIBCUDA_PATH"] = str(libcuda[0].parent)
    return env


class CandidateGroup:
    """The processes verifying one op: ``world`` ranks in one sandbox (or unconfined).

    Every read and write of a rank's channel runs under the earliest of the per-call ``timeout``
    and ``deadline`` (the op's, itself bounded by the run's); a reply may take no more bytes than
    the buffer set it answers for (known here: the parent declared it) plus the bounded text of
    a message; every message is escaped as it is decoded."""

    def __init__(
        self,
        bundle: Snapshot,
        declared: tuple[str, ...],
        op: OpEntry,
        device: str,
        world: int,
        confinement: Confinement,
        limits: Limits,
        timeout: float,
        *,
        deadline: Deadline | None = None,
    ) -> None:
        self.world = world
        self.confinement = confinement
        self._timeout = timeout
        self._deadline = deadline
        self._sets: dict[tuple[int, int], int] = {}  # (rank, buffer set) -> its tensors' bytes
        self._tmp = tempfile.TemporaryDirectory(prefix="cacheon-verify-")
        tmp = Path(self._tmp.name)
        self._output = OutputTail(tmp / "candidate.out")
        materialise(bundle, declared, tmp / "bundle")  # the admitted bytes, never the bundle's path again
        confined = confinement is Confinement.BUBBLEWRAP
        workdir = WORKDIR if confined else str(tmp / "work")
        if not confined:
            os.mkdir(workdir, 0o700)
        pairs = [socket.socketpair() for _ in range(world)]
        self._ends = [channel.Endpoint(parent) for parent, _ in pairs]
        child_fds = [child.detach() for _, child in pairs]
        boot = Boot(
            rank=0 if world == 1 else -1, world=world, fds=child_fds,
            bundle=BUNDLE_MOUNT if confined else str(tmp / "bundle"),
            slot=op.slot, source=op.source, entry=op.entry, prepare=op.prepare, device=device,
            limits=BootLimits(limits.cpu_seconds, limits.address_space_bytes, limits.file_bytes, limits.open_files,
                              limits.processes if confined else None),
            drop_uid=SANDBOX_UID if confined and os.geteuid() == 0 else None,
            workdir=workdir, rendezvous=f"file://{workdir}/rendezvous", confinement=confinement.value,
        )
        mounts = Mounts.of_this_interpreter()
        paths = mounts.child_paths() if confined else [os.path.dirname(mounts.package), *mounts.site]
        command = [mounts.interpreter, "-I", "-S", "-B", "-c", BOOTSTRAP, ":".join(paths),
                   msgspec.json.encode(boot).decode()]
        env = _child_env(device, workdir)
        self._launch: Launch | None = None
        try:
            if confined:
                self._launch = Launch.start(mounts, str(tmp / "bundle"), device, limits.tmpfs_bytes, command, env,
                                            child_fds, self._output.path,
                                            tree=TreeLimits(limits.memory_bytes, limits.processes))
                self._process = self._launch.process
            else:
                with self._output.path.open("ab") as out:
                    self._process = subprocess.Popen(command, pass_fds=child_fds, env=env, cwd=workdir,
                                                     stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                                     start_new_session=True)
        finally:
            for fd in child_fds:
                os.close(fd)
            self._output.start()

    def __enter__(self) -> CandidateGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rank_prefix(self, rank: int) -> str:
        return f"rank {rank}: " if self.world > 1 else ""

    def _bound(self, timeout: float | None) -> Deadline:
        timeout = self._timeout if timeout is None else timeout
        return earliest(Deadline.after(timeout, f"{timeout:g}s (--timeout)"), self._deadline)

    def receive(self, rank: int, timeout: float | None = None, limit: int = channel.TEXT_BUDGET) -> FromChild:
        """One message from ``rank``, of at most ``limit`` bytes, under the earliest deadline."""
        bound = self._bound(timeout)
        prefix = self._rank_prefix(rank)
        try:
            data = self._ends[rank].receive(limit, bound.at)
        except (EOFError, ConnectionResetError, BrokenPipeError):
            raise ChildFailure("crashed", prefix + self._exit_description()) from None
        except channel.ChannelTimeout as late:
            self.kill()
            where = f" (it stopped mid-frame, after {late.partial} bytes)" if late.partial else ""
            raise ChildFailure("timeout", f"{prefix}no answer within {bound.what}{where}; the candidate process "
                               "was killed") from None
        except (channel.ChannelError, OSError) as exc:
            self.kill()
            raise ChildFailure("protocol", f"{prefix}unreadable message ({exc})") from None
        try:
            return escaped(channel.decode_from_child(data))
        except channel.ChannelError as exc:
            self.kill()
            raise ChildFailure("protocol", f"{prefix}the candidate process sent an invalid "
                               f"message ({escape_controls(str(exc))[:MAX_REASON]})") from None

    def send(self, rank: int, message: ToChild) -> None:
        bound = self._bound(None)
        try:
            self._ends[rank].send(channel.encode(message), bound.at)
        except channel.ChannelTimeout:
            self.kill()
            raise ChildFailure("timeout", f"{self._rank_prefix(rank)}the candidate process stopped reading its "
                               f"channel: a message was not taken within {bound.what}; it was killed") from None
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            raise ChildFailure("crashed", self._rank_prefix(rank) + self._exit_description()) from None

    def boot(self, import_timeout: float) -> dict[str, str]:
        """Wait for every rank's confinement, then its import; return what rank 0 applied."""
        applied: dict[str, str] = {}
        for rank in range(self.world):
            try:
                booted = self.receive(rank, 60.0)
            except ChildFailure as failure:
                if self._deadline is not None and self._deadline.passed():
                    raise  # the op's (or the run's) time ran out, not the sandbox's start
                raise InfrastructureError(f"the candidate's sandbox did not start ({failure.reason}; "
                                          f"{one_line(self.output_tail())})") from None
            if not isinstance(booted, Booted):
                self.kill()
                raise ChildFailure("protocol", f"{self._rank_prefix(rank)}expected a boot message")
            applied = applied or {**booted.applied, **(self._launch.confinement if self._launch else {})}
        for rank in range(self.world):
            ready = self.receive(rank, import_timeout)
            if isinstance(ready, ImportFailed):
                raise ChildFailure("import_error", self._rank_prefix(rank) + one_line(ready.reason), ready.detail)
            if not isinstance(ready, Ready):
                self.kill()
                raise ChildFailure("protocol", f"{self._rank_prefix(rank)}expected a ready message")
        return applied

    def exchange(self, messages: Sequence[ToChild], seq: int) -> list[Reply]:
        """One message to each rank (all sent before any answer is awaited), one reply from each,
        of at most the bytes of the buffer set it answers for."""
        limits = [self._reply_limit(rank, message) for rank, message in enumerate(messages)]
        for rank, message in enumerate(messages):
            self.send(rank, message)
        replies: list[Reply] = []
        for rank in range(len(messages)):
            reply = self.receive(rank, limit=limits[rank])
            if isinstance(reply, (Booted, Ready, ImportFailed)) or reply.seq != seq:
                self.kill()
                raise ChildFailure("protocol", f"{self._rank_prefix(rank)}answered out of turn")
            replies.append(reply)
        return replies

    def _reply_limit(self, rank: int, message: ToChild) -> int:
        """What the reply to ``message`` may take: its buffer set's tensors (as the parent declared
        them, mirroring the child: fresh on a first call, kept on a refill), then the text budget.
        A capture's reply carries no tensor."""
        call = message.call if isinstance(message, Capture) else message
        if isinstance(call, Call) and (not call.refill or (rank, call.buffers) not in self._sets):
            self._sets[rank, call.buffers] = channel.buffer_bytes(call)
        if isinstance(message, (Capture, Stop)):
            return channel.TEXT_BUDGET
        return self._sets.get((rank, message.buffers), 0) + channel.TEXT_BUDGET

    def extra_processes(self) -> int | None:
        """Processes in the sandbox beyond bubblewrap's init, the child and (collectives) its
        ranks: what the candidate started and left running, nested PID namespaces included. None
        when unconfined (not visible)."""
        if self._launch is None or self._launch.child_pid is None:
            return None
        expected = 2 + (self.world if self.world > 1 else 0)
        return max(0, len(self._launch.processes()) - expected)

    def output_tail(self) -> str:
        """The end of what the candidate printed (untrusted text, escaped, for the report only);
        once its processes are gone, all of it up to their last words."""
        if self._process.poll() is not None:
            self._output.settle(2.0)
        return self._output.text()

    @property
    def output_bytes(self) -> int:
        """How much the candidate printed, kept or not."""
        return self._output.total

    def _exit_description(self) -> str:
        breach = self._launch.breach() if self._launch is not None else None
        if breach is not None:
            self.kill()
            return breach
        try:
            code = self._process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "the candidate process stopped answering"
        if self.world > 1:
            return f"a candidate process ended (the sandbox exited with code {code})"
        signum = -code if code < 0 else code - 128 if self._launch is not None and code > 128 else 0
        if signum:
            with contextlib.suppress(ValueError):
                return f"the candidate process died from signal {signal.Signals(signum).name}"
        return f"the candidate process exited with code {code}"

    def kill(self) -> None:
        """End every process of the candidate: the sandbox (its PID namespace dies with it), or
        unconfined, the child's process group."""
        if self._launch is not None:
            self._launch.end()
            return
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(5)

    def close(self) -> None:
        if self._process.poll() is None:
            stop = channel.encode(Stop())
            for end in self._ends:
                with contextlib.suppress(OSError, EOFError, channel.ChannelError):
                    end.send(stop, Deadline.after(STOP_SECONDS, "stop").at)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(5)
        self.kill()
        for end in self._ends:
            end.close()
        self._output.close()
        self._tmp.cleanup()
