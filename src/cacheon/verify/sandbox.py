"""The sandbox around the candidate's processes: bubblewrap, as the verifier's host side builds it.

New user, PID, network, IPC, UTS and cgroup namespaces; an unprivileged uid (65534) and no
capabilities; ``--die-with-parent`` and a new session; the rest of the host is not there. What is
mounted, read-only: the interpreter's prefix, the system libraries it links against, the
site-packages, the ``cacheon`` package alone (never the checkout it may sit in) and a private copy
of the bundle. ``/tmp`` (also the working directory and HOME) is a private, size-limited tmpfs.
The network namespace has only loopback, which every rank of a collective shares. On CUDA the
``/dev/nvidia*`` nodes are added, and ``/usr`` whole for the compiler Triton builds with.

Run as root, bubblewrap is told to wait until the verifier has written the new user namespace's
uid/gid maps (sandbox root = host root for the mounts, 65534 = host 65534 for the child); the child
then drops to 65534 itself. Its processes are then not host root, so the process limit holds
(the kernel exempts uid 0 from RLIMIT_NPROC even inside a user namespace).

Beyond the namespaces and the rlimits (``Guards``): nested user namespaces are disabled
(``--disable-userns``, and bubblewrap asserts it), so no process inside can gain capabilities over
a mount, a tmpfs or a namespace of its own; a seccomp filter (``syscall_filter``) refuses whole
kernel subsystems a kernel never needs; one bound holds the memory and processes of the whole
tree, and the census counts the sandbox init's descendants (``tree_bound``). /dev is read-only
but for a size-limited /dev/shm.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import select
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import cacheon
from cacheon.errors import CacheonError
from cacheon.verify import syscall_filter
from cacheon.verify.tree_bound import Bound, TreeLimits, descendants, open_bound

SANDBOX_UID = 65534
INSTALL_HINT = "install it (Debian/Ubuntu: apt-get install bubblewrap), or pass --confinement none to run unconfined"
BUNDLE_MOUNT = "/cacheon/bundle"
LIB_MOUNT = "/cacheon/lib"
SITE_MOUNT = "/cacheon/site"
WORKDIR = "/tmp"
_SYSTEM_LIBS = ("/lib", "/lib64", "/lib32", "/libx32")
_USR_LIBS = ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32")


class SandboxUnavailable(CacheonError):
    """bubblewrap is missing or cannot create namespaces here (exit 1: nothing was run)."""


@dataclass(frozen=True)
class Guards:
    """The guards beyond namespaces and rlimits. Every one is on outside the tests, which turn one
    off only to show the attack it stops working without it (a negative control)."""

    userns: bool = True  # --disable-userns --assert-userns-disabled
    seccomp: bool = True  # the syscall filter
    aggregate: bool = True  # one memory/process bound for the tree (cgroup v2 or supervisor)


GUARDS = Guards()


@dataclass(frozen=True)
class Mounts:
    """Host paths the sandbox needs, and where the child sees them."""

    interpreter: str  # the real executable, bound at the same path
    prefixes: tuple[str, ...]  # the interpreter's installation(s), bound at the same paths
    site: tuple[str, ...]  # site-packages directories, bound under SITE_MOUNT/<i>
    package: str  # the cacheon package directory, bound at LIB_MOUNT/cacheon

    @classmethod
    def of_this_interpreter(cls) -> Mounts:
        executable = os.path.realpath(sys.executable)
        prefixes = {os.path.realpath(sys.base_prefix)}
        if not any(executable.startswith(p + os.sep) for p in prefixes):
            prefixes.add(os.path.dirname(executable))
        paths = sysconfig.get_paths()
        site = tuple(dict.fromkeys(os.path.realpath(paths[k]) for k in ("purelib", "platlib")))
        return cls(executable, tuple(sorted(prefixes)), site, os.path.realpath(os.path.dirname(cacheon.__file__)))

    def child_paths(self) -> list[str]:
        """``sys.path`` additions inside the sandbox: cacheon first, then the site-packages."""
        return [LIB_MOUNT] + [f"{SITE_MOUNT}/{i}" for i in range(len(self.site))]


def _dirs_for(dest: str, made: set[str]) -> list[str]:
    """``--dir`` for each missing ancestor of ``dest``, world-traversable (bwrap makes them 0700)."""
    args: list[str] = []
    parts = Path(dest).parts[1:-1]
    for i in range(len(parts)):
        parent = "/" + "/".join(parts[: i + 1])
        if parent not in made:
            made.add(parent)
            args += ["--perms", "0755", "--dir", parent]
    return args


def bwrap_argv(
    mounts: Mounts,
    bundle_copy: str,
    device: str,
    tmpfs_bytes: int,
    as_root: bool,
    info_fd: int,
    block_fd: int | None = None,
    nvidia_nodes: Sequence[str] = (),
    extra: Sequence[str] = (),
    *,
    seccomp_fd: int | None = None,
    disable_userns: bool = True,
) -> list[str]:
    """The bubblewrap command line up to (not including) the command. As root, bubblewrap blocks
    on ``block_fd`` until the verifier has written the id maps of the child named on ``info_fd``.
    ``extra`` (bubblewrap options, e.g. more binds under ``/cacheon``) goes after the device nodes;
    ``seccomp_fd`` is read to its end by bubblewrap: the BPF of ``syscall_filter.compiled``."""
    argv = [bwrap_binary(), "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--info-fd", str(info_fd)]
    if disable_userns:  # as root the verifier disables them itself (bwrap refuses it with a block fd)
        argv += ["--assert-userns-disabled"] if as_root else ["--disable-userns", "--assert-userns-disabled"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if as_root:
        if block_fd is None:
            raise ValueError("as root, bubblewrap needs a userns block fd")
        argv += ["--userns-block-fd", str(block_fd), "--cap-drop", "ALL",
                 "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL"]
    binds: list[tuple[str, str]] = []
    if device == "cuda":
        binds.append(("/usr", "/usr"))
    else:
        binds += [(p, p) for p in _USR_LIBS if os.path.isdir(p) and not os.path.islink(p)]
    for path in _SYSTEM_LIBS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            binds.append((path, path))
    binds += [(p, p) for p in mounts.prefixes]
    binds += [(p, f"{SITE_MOUNT}/{i}") for i, p in enumerate(mounts.site)]
    binds += [(mounts.package, f"{LIB_MOUNT}/cacheon"), (bundle_copy, BUNDLE_MOUNT)]
    # The private /tmp first: a bind below it (a server venv or model under /tmp, bound at its own path) is then
    # mounted on top of it, where a tmpfs mounted after would hide it ("execvp ...: No such file or directory").
    argv += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", WORKDIR]
    made: set[str] = {WORKDIR}
    for source, dest in binds:
        argv += [*_dirs_for(dest, made), "--ro-bind", source, dest]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for node in nvidia_nodes:
        argv += ["--dev-bind", node, node]
    # /dev is a tmpfs bubblewrap makes without a size; only /dev/shm (NCCL's) stays writable, sized
    argv += ["--perms", "1777", "--size", str(tmpfs_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    argv += list(extra)
    argv += ["--chdir", WORKDIR]
    return argv


def nvidia_device_nodes() -> list[str]:
    """The GPU device nodes a CUDA run needs (and nothing else under /dev)."""
    return sorted(p for p in glob.glob("/dev/nvidia*") if not os.path.isdir(p))


def bwrap_binary() -> str:
    """The bwrap on the verifier's PATH, by absolute path (the child's environment has another PATH)."""
    return shutil.which("bwrap") or "bwrap"


@lru_cache(maxsize=1)
def _probe() -> str | None:
    """None when bubblewrap can build this sandbox here; else why not (one line)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if (old := _lacks_options()) is not None:
        return old
    mounts = Mounts.of_this_interpreter()
    with tempfile.TemporaryDirectory(prefix="cacheon-probe-") as tmp:
        empty, log = Path(tmp) / "bundle", Path(tmp) / "log"
        empty.mkdir(mode=0o755)
        try:
            sandbox = Launch.start(mounts, str(empty), "cpu", 64 << 20, [mounts.interpreter, "-I", "-S", "-c", "pass"],
                                   {}, (), log)
        except SandboxUnavailable as exc:
            return str(exc)
        try:
            code = sandbox.process.wait(30)
        except subprocess.TimeoutExpired:
            sandbox.process.kill()
            return "bubblewrap did not finish a trivial sandbox within 30 s"
        if code != 0:
            return f"bubblewrap cannot create the sandbox here ({last_line(log)})"
    return None


def _lacks_options() -> str | None:
    """Why this bubblewrap cannot apply the sandbox's guards (it is older than 0.8), else None."""
    try:
        done = subprocess.run([bwrap_binary(), "--help"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None  # the trivial sandbox below names what is wrong
    text = done.stdout.decode(errors="replace")
    missing = [o for o in ("--disable-userns", "--assert-userns-disabled", "--seccomp") if o not in text]
    if done.returncode != 0 or not missing:
        return None
    return f"this bubblewrap lacks {', '.join(missing)} (0.8 or later is needed)"


def require_bubblewrap() -> None:
    """Refuse (exit 1, one line) when the sandbox cannot run on this host."""
    problem = _probe()
    if problem is not None:
        raise SandboxUnavailable(f"cannot confine the candidate: {problem}; {INSTALL_HINT}")


def last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no message"
    return lines[-1] if lines else "no message"


@dataclass
class Launch:
    """A started sandbox: the bubblewrap process, the sandbox's init (host pid) and PID namespace,
    the bound on its whole tree, and what confines it beyond the child's own record."""

    process: subprocess.Popen[bytes]
    child_pid: int | None
    pid_namespace: int | None
    bound: Bound | None = None
    confinement: dict[str, str] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        mounts: Mounts,
        bundle_copy: str,
        device: str,
        tmpfs_bytes: int,
        command: list[str],
        env: dict[str, str],
        pass_fds: Sequence[int],
        log: Path,
        extra: Sequence[str] = (),
        *,
        tree: TreeLimits | None = None,
        guards: Guards | None = None,
    ) -> Launch:
        """Start ``command`` in a new sandbox, its stdout and stderr (and bubblewrap's) to ``log``;
        ``extra`` as :func:`bwrap_argv` takes it; ``tree`` bounds the memory and processes of
        everything in it together."""
        guards = GUARDS if guards is None else guards
        as_root = os.geteuid() == 0
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe() if as_root else (None, None)
        filter_fd = seccomp_fd(device) if guards.seccomp else None
        nodes = nvidia_device_nodes() if device == "cuda" else []
        argv = bwrap_argv(mounts, bundle_copy, device, tmpfs_bytes, as_root, info_w, block_r, nodes, extra,
                          seccomp_fd=filter_fd, disable_userns=guards.userns)
        sync = tuple(fd for fd in (info_w, block_r, filter_fd) if fd is not None)
        bound = open_bound(tree) if tree is not None and guards.aggregate else None
        try:
            with log.open("ab") as out:
                process = subprocess.Popen([*argv, *command], pass_fds=(*pass_fds, *sync), env=env,
                                           stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        except OSError as exc:
            if bound is not None:
                bound.close()
            raise SandboxUnavailable(f"bubblewrap could not be started ({exc.strerror})") from None
        finally:
            for fd in sync:
                os.close(fd)
        launch = cls(process, None, None, bound, _record(guards, device, bound, as_root))
        try:
            info = _read_info(info_r, process)
            if info is not None:
                launch.child_pid, launch.pid_namespace = int(info["child-pid"]), int(info["pid-namespace"])
                launch._adopt()
                if block_w is not None:
                    _write_id_maps(launch, block_w, disable_userns=guards.userns)
        finally:
            os.close(info_r)
            if block_w is not None:
                os.close(block_w)
        return launch

    def _adopt(self) -> None:
        """Put the sandbox's init under the bound; as root it is still blocked, before it forks."""
        if self.bound is None or self.child_pid is None:
            return
        try:
            self.bound.adopt(self.child_pid)
        except OSError as exc:
            self.end()
            raise SandboxUnavailable(f"the sandbox could not be put under its bound ({exc.strerror})") from None

    def processes(self) -> list[int]:
        """Host pids of the sandbox's init and of everything below it, nested PID namespaces and
        re-parented processes included (the cgroup's members where a cgroup is in force)."""
        if self.bound is not None:
            return self.bound.members()
        return descendants(self.child_pid) if self.child_pid is not None else []

    def breach(self) -> str | None:
        """Why the bound killed the sandbox, if it did."""
        return self.bound.breach() if self.bound is not None else None

    def end(self) -> None:
        """Kill everything left in the sandbox and release its bound."""
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        if self.bound is not None:
            self.bound.close()


def seccomp_fd(device: str) -> int:
    """A file descriptor holding the filter's BPF at offset 0 (for ``--seccomp``); the caller closes it."""
    try:
        program = syscall_filter.compiled(device)
    except syscall_filter.FilterUnavailable as exc:
        raise SandboxUnavailable(f"the sandbox's seccomp filter cannot be built: {exc}") from None
    fd = os.memfd_create("cacheon-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _record(guards: Guards, device: str, bound: Bound | None, as_root: bool) -> dict[str, str]:
    """The host side of the confinement, for the report beside what the child applied."""
    return {
        "nested_userns": ("allowed (guard off)" if not guards.userns else
                          "disabled (user.max_user_namespaces 0, asserted by bwrap)" if as_root else
                          "disabled (bwrap --disable-userns, asserted)"),
        "seccomp": syscall_filter.describe(device) if guards.seccomp else "no filter (guard off)",
        "aggregate_bound": bound.describe() if bound is not None else "none",
        "census": "descendants of the sandbox's init",
    }


def _read_info(fd: int, process: subprocess.Popen[bytes]) -> dict[str, int] | None:
    """bubblewrap's info JSON (child pid, namespace ids); None if it exited before writing it."""
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 30)
        if not ready:
            process.kill()
            raise SandboxUnavailable("bubblewrap did not report its child within 30 s")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    if not data.strip():
        return None
    parsed: dict[str, int] = json.loads(data)
    return parsed


def _write_id_maps(launch: Launch, block_fd: int, disable_userns: bool = True) -> None:
    """Sandbox root is host root (for the mounts only; it holds no capability outside), and the
    child's uid and gid 65534 are host 65534; no user namespace can be made inside it (its
    ``user.max_user_namespaces`` is 0: what ``--disable-userns`` does, which bubblewrap will not
    combine with a block fd). Then let bubblewrap go on."""
    try:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{launch.child_pid}/{name}", "w", encoding="ascii") as fh:
                fh.write(f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n")
        if disable_userns:
            _forbid_nested_userns(launch)
        os.write(block_fd, b"1")
    except OSError as exc:
        launch.end()
        raise SandboxUnavailable(f"the sandbox's user namespace could not be mapped ({exc.strerror})") from None


def _forbid_nested_userns(launch: Launch) -> None:
    """Set the sandbox user namespace's ``user.max_user_namespaces`` to 0, from inside it (nsenter:
    a multi-threaded process cannot enter a user namespace)."""
    nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
    try:
        done = subprocess.run([nsenter, f"--user=/proc/{launch.child_pid}/ns/user", "--", "/bin/sh", "-c",
                               "echo 0 > /proc/sys/user/max_user_namespaces"],
                              capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        launch.end()
        raise SandboxUnavailable(f"nested user namespaces could not be disabled ({exc}; nsenter is in util-linux)") \
            from None
    if done.returncode != 0:
        launch.end()
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise SandboxUnavailable(f"nested user namespaces could not be disabled ({message[-1] if message else ''})")


def processes_in(pid_namespace: int) -> list[int]:
    """Host pids of every process in a PID namespace (the sandbox's, from outside)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/pid").st_ino == pid_namespace:
                found.append(int(entry))
        except OSError:
            continue
    return found
