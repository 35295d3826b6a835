"""One memory and process bound for a whole sandbox tree, and the census of that tree.

rlimits are per process: 32 GiB of address space times 256 processes is far more than a host has,
and memory that is no process's address space (a memfd, a tmpfs file) escapes them. So the whole
tree gets one bound: a cgroup v2 (``memory.max``, ``memory.swap.max`` = 0, ``pids.max``,
``memory.oom.group``) where the host lets the verifier make one, else a supervisor thread in the
parent that sums, every ``POLL_SECONDS``, the tree's resident memory (PSS), its memfds and the
most its sockets and pipes can buffer, and kills the tree past the bound. The supervisor can
overshoot by what the tree allocates in one interval; the process count is then bounded by the
sandbox uid's RLIMIT_NPROC, which counts the whole tree.

The census is by descent from the sandbox's init (the cgroup's members where one is in force), so a
process in a nested PID namespace or re-parented inside the sandbox is still counted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

POLL_SECONDS = 0.1
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _sysctl(name: str, default: int) -> int:
    try:
        with open(f"/proc/sys/{name}", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


#: what one socket's queued data can hold at most (the kernel doubles a SO_SNDBUF up to wmem_max);
#: unix sockets have no host-wide cap (TCP's is net.ipv4.tcp_mem), so the supervisor charges this
SOCKET_BYTES = 2 * _sysctl("net/core/wmem_max", 212992)
#: what one pipe can hold at most (F_SETPIPE_SZ up to pipe-max-size without privilege)
PIPE_BYTES = _sysctl("fs/pipe-max-size", 1 << 20)
_CONTROLLERS = {"memory", "pids"}


@dataclass(frozen=True)
class TreeLimits:
    memory_bytes: int
    processes: int


class Bound(Protocol):
    """What the launcher needs of either bound."""

    def adopt(self, init_pid: int) -> None: ...
    def members(self) -> list[int]: ...
    def breach(self) -> str | None: ...
    def describe(self) -> str: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it, by parent pid (from /proc, as the host sees them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])  # the name may hold spaces and ')'
        children.setdefault(ppid, []).append(int(entry))
    if not os.path.exists(f"/proc/{root}"):
        return []
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_memory(pids: list[int], proportional: bool = False) -> int:
    """Resident bytes of ``pids`` plus what their open or mapped files hold outside any address
    space: a memfd its size (mapped or not, its fd closed or not), a socket or a pipe the most its
    buffers can (each counted once). Resident is RSS (cheap; a page shared between the processes
    counts once per process) or, with ``proportional``, PSS (each shared page split between its
    sharers; ~ms per process to read)."""
    total, seen = 0, set[str]()
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += _pss(pid) if proportional else _rss(pid)
        total += _mapped_memfds(pid, seen)
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("/memfd:"):
                        st = os.stat(f"/proc/{pid}/fd/{fd}")
                        key, size = f"memfd:{st.st_dev}:{st.st_ino}", st.st_blocks * 512
                    elif link.startswith(("socket:", "pipe:")):
                        key, size = link, SOCKET_BYTES if link.startswith("socket:") else PIPE_BYTES
                    else:
                        continue
                    if key not in seen:
                        seen.add(key)
                        total += size
    return total


def _mapped_memfds(pid: int, seen: set[str]) -> int:
    """The size of each memfd ``pid`` maps, once (a mapping keeps it alive after its fd is closed)."""
    total = 0
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/maps", "rb") as fh:
            ranges = [line.split(maxsplit=1)[0].decode() for line in fh if b" /memfd:" in line]
        for span in ranges:
            with contextlib.suppress(OSError):
                st = os.stat(f"/proc/{pid}/map_files/{span}")
                if (key := f"memfd:{st.st_dev}:{st.st_ino}") not in seen:
                    seen.add(key)
                    total += st.st_blocks * 512
    return total


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as fh:
        return int(fh.read().split()[1]) * _PAGE


def _pss(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
        for line in fh:
            if line.startswith(b"Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def _mib(n: int) -> str:
    return f"{n >> 20} MiB"


class Supervisor:
    """The fallback bound: a thread that polls the tree and kills it past ``memory_bytes``."""

    def __init__(self, limits: TreeLimits, why: str = "") -> None:
        self.limits = limits
        self.why = why  # why no cgroup is in force
        self._pidfd: int | None = None
        self._root = 0
        self._breach: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cacheon-sandbox-supervisor", daemon=True)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def adopt(self, init_pid: int) -> None:
        self._root = init_pid
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(init_pid)  # a signal through it cannot reach a reused pid
        self._thread.start()

    def members(self) -> list[int]:
        return descendants(self._root) if self._root else []

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            pids = self.members()
            used = tree_memory(pids)
            if used > self.limits.memory_bytes:  # RSS >= PSS: only then is the precise sum worth its cost
                used = tree_memory(pids, proportional=True)
            if used > self.limits.memory_bytes:
                self._breach = (f"the sandbox's processes held {_mib(used)} together, past the aggregate bound of "
                                f"{_mib(self.limits.memory_bytes)}; the sandbox was killed")
                self.kill()
                return

    def breach(self) -> str | None:
        return self._breach

    def describe(self) -> str:
        return (f"supervisor: resident memory (PSS) + memfds + socket/pipe buffers (at most) of the whole tree <= "
                f"{_mib(self.limits.memory_bytes)}, "
                f"polled every {POLL_SECONDS:g}s; processes by the sandbox uid's RLIMIT_NPROC"
                + (f" (no cgroup: {self.why})" if self.why else ""))

    def kill(self) -> None:
        """SIGKILL the sandbox's init: its PID namespace, nested ones included, dies with it."""
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self.kill()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class CgroupUnavailable(Exception):
    """The host does not let the verifier make a bounded cgroup here (the reason is the message)."""


def _cgroup2_mount() -> Path:
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    raise CgroupUnavailable("no cgroup v2 hierarchy is mounted")


def _own_cgroup() -> str:
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("0::"):
                return line[3:].strip()
    raise CgroupUnavailable("this process is in no cgroup v2")


class Cgroup:
    """A fresh cgroup v2 under the nearest ancestor of the verifier's own that delegates the memory
    and pids controllers; removed on close. The kernel enforces it: no polling, no overshoot."""

    def __init__(self, limits: TreeLimits) -> None:
        self.limits = limits
        mount = _cgroup2_mount()
        node = (mount / _own_cgroup().lstrip("/")).resolve()
        while not set(_read(node / "cgroup.subtree_control").split()) >= _CONTROLLERS:
            if node == mount or mount not in node.parents:
                raise CgroupUnavailable(f"no cgroup above this process delegates memory and pids (under {mount})")
            node = node.parent
        self.path = node / f"cacheon-sandbox-{uuid.uuid4().hex[:12]}"
        try:
            self.path.mkdir()
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create a cgroup under {node} ({exc.strerror})") from None
        try:
            _write(self.path / "memory.max", str(limits.memory_bytes))
            _write(self.path / "pids.max", str(limits.processes))
            _write(self.path / "memory.oom.group", "1")
            if (self.path / "memory.swap.max").exists():
                _write(self.path / "memory.swap.max", "0")
        except OSError as exc:
            self.close()
            raise CgroupUnavailable(f"cannot set the bounds of {self.path} ({exc.strerror})") from None

    def __enter__(self) -> Cgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def adopt(self, init_pid: int) -> None:
        """Move the sandbox's init in before it starts anything: all it forks is born inside."""
        _write(self.path / "cgroup.procs", str(init_pid))

    def members(self) -> list[int]:
        return [int(p) for p in _read(self.path / "cgroup.procs").split()]

    def _events(self, name: str) -> dict[str, int]:
        with contextlib.suppress(OSError, ValueError):
            return {k: int(v) for k, v in (line.split() for line in _read(self.path / name).splitlines())}
        return {}

    def breach(self) -> str | None:
        if self._events("memory.events").get("oom_kill", 0):
            return (f"the sandbox reached its aggregate memory bound ({_mib(self.limits.memory_bytes)}, cgroup "
                    "memory.max) and was killed")
        if self._events("pids.events").get("max", 0):
            return f"the sandbox reached its aggregate process bound ({self.limits.processes}, cgroup pids.max)"
        return None

    def describe(self) -> str:
        return (f"cgroup v2 {self.path}: memory.max {_mib(self.limits.memory_bytes)}, swap 0, "
                f"pids.max {self.limits.processes}")

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            if (self.path / "cgroup.kill").exists():
                _write(self.path / "cgroup.kill", "1")
            for pid in self.members():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        """Kill what is left, wait for the cgroup to empty (5 s at most), remove it."""
        deadline = time.monotonic() + 5
        while self.path.exists():
            self.kill()
            with contextlib.suppress(OSError):
                self.path.rmdir()
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(value)


def open_bound(limits: TreeLimits) -> Cgroup | Supervisor:
    """The kernel's bound (cgroup v2) where root can make one here, else the supervisor."""
    if os.geteuid() != 0:
        return Supervisor(limits, "not root")
    try:
        return Cgroup(limits)
    except CgroupUnavailable as exc:
        return Supervisor(limits, str(exc))
