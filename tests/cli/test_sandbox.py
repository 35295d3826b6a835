"""The sandbox is the guard: each escape a candidate tries fails under bubblewrap with a clean FAIL,
and the same bundle shows the escape working with ``--confinement none`` (the negative control).

The escapes need ``os``/``socket``, which the scan refuses, so these tests call ``verify_bundle``
directly (the scan bypassed on purpose) to reach the sandbox itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import stat
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from cacheon.bundle.manifest import load_manifest
from cacheon.bundle.snapshot import read_snapshot
from cacheon.verify import sandbox
from cacheon.verify.plan import Confinement, Limits, VerifyOptions
from cacheon.verify.report import VerifyReport
from cacheon.verify.runner import verify_bundle
from cacheon.verify.sandbox import Guards, Launch, processes_in
from tests.conftest import EXAMPLES, assert_verdict, write_bundle

CONFINED, UNCONFINED = Confinement.BUBBLEWRAP, Confinement.NONE
KERNEL = """

def silu_and_mul(x, out):
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
"""


def run(tmp_path: Path, name: str, escape: str, confinement: Confinement, limits: Limits | None = None) -> VerifyReport:
    """A faithful kernel whose module first tries ``escape`` at import."""
    root = write_bundle(tmp_path / f"{name}-{confinement.value}-{uuid.uuid4().hex[:6]}", "activation.silu_and_mul",
                        "silu_and_mul", "import os\nimport sys\nimport torch\n" + textwrap.dedent(escape) + KERNEL)
    options = VerifyOptions(dtypes=("float32",), stability_calls=10, confinement=confinement, timeout=60,
                            limits=limits)
    return verify_bundle(snapshot := read_snapshot(root), load_manifest(snapshot), options)


#: an aggregate bound small enough to breach cheaply: the child holds ~230 MiB once torch is imported
SMALL = Limits(memory_bytes=512 << 20)
#: the raw syscalls the escapes below make (Python 3.11 has no os.unshare); x86_64 and aarch64 numbers
LIBC = """
    import ctypes, platform
    libc = ctypes.CDLL(None, use_errno=True)
    NR = {"keyctl": (250, 219), "mount": (165, 40)}
    def syscall(name, *args):
        if libc.syscall(NR[name][platform.machine() != "x86_64"], *args) < 0:
            raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")
    def unshare(flags):
        if libc.unshare(flags) != 0:
            raise OSError(ctypes.get_errno(), f"unshare: {os.strerror(ctypes.get_errno())}")
    def forked(attack):  # a user namespace needs a single-threaded caller: torch's child is not one
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                attack()
                message = ""
            except OSError as exc:
                message = str(exc)
            os.write(w, message.encode())
            os._exit(0)
        os.close(w)
        message = os.read(r, 4096).decode()
        os.waitpid(pid, 0)
        if message:
            raise OSError(message)
    def become_root_of():  # in a user namespace just made: uid 0 there is us outside
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: unshare cleared it, and /proc/self went to root
        uid, gid = os.getuid(), os.getgid()
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
"""
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID = 0x10000000, 0x20000, 0x20000000


def guarded(monkeypatch: pytest.MonkeyPatch, **off: bool) -> None:
    """Run the sandbox with the named guards off (a negative control)."""
    monkeypatch.setattr(sandbox, "GUARDS", Guards(**off))


def failed_cleanly(report: VerifyReport, text: str) -> None:
    assert report.verdict == "FAIL", report.reason
    assert text in report.reason, report.reason
    assert "Traceback" not in report.reason and "\n" not in report.reason


def test_write_a_host_file(tmp_path):
    target = tmp_path / "host-file.txt"
    target.write_text("original\n")
    escape = f"with open({str(target)!r}, 'a') as fh:\n    fh.write('escaped\\n')\n"
    failed_cleanly(run(tmp_path, "write", escape, CONFINED), "FileNotFoundError")
    assert target.read_text() == "original\n"
    assert run(tmp_path, "write", escape, UNCONFINED).verdict == "NUMERICAL_PASS"  # negative control
    assert target.read_text() == "original\nescaped\n"


def test_read_a_host_file(tmp_path):
    ledger = tmp_path / "ledger.sqlite3"
    secret = uuid.uuid4().hex
    with contextlib.closing(sqlite3.connect(ledger)) as db, db:
        db.execute("CREATE TABLE records(details TEXT)")
        db.execute("INSERT INTO records VALUES (?)", (secret,))
    escape = f"data = open({str(ledger)!r}, 'rb').read()\nprint('LEAKED', data[-4000:], flush=True)\n"
    report = run(tmp_path, "read", escape, CONFINED)
    failed_cleanly(report, "FileNotFoundError")
    assert secret not in report.ops[0].candidate_output
    leaked = run(tmp_path, "read", escape, UNCONFINED)  # negative control
    assert leaked.verdict == "NUMERICAL_PASS" and secret in leaked.ops[0].candidate_output


def test_connect_to_a_loopback_server(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(2)
    port = server.getsockname()[1]
    escape = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'hi')\n"
    try:
        failed_cleanly(run(tmp_path, "net", escape, CONFINED), "ConnectionRefusedError")
        with pytest.raises(TimeoutError):
            server.accept()
        assert run(tmp_path, "net", escape, UNCONFINED).verdict == "NUMERICAL_PASS"  # negative control
        conn, _ = server.accept()
        conn.close()
    finally:
        server.close()


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


def test_leave_a_process_behind(tmp_path):
    marker = f"cacheon-orphan-{uuid.uuid4().hex}"
    escape = f"""
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork():
                os._exit(0)
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", {marker!r}])
        os.waitpid(pid, 0)
    """
    report = run(tmp_path, "orphan", escape, CONFINED)
    failed_cleanly(report, "left 1 process(es) running in the sandbox")
    assert _processes_with(marker) == []  # it died with the sandbox
    assert run(tmp_path, "orphan", escape, UNCONFINED).verdict == "NUMERICAL_PASS"  # negative control
    survivors = _processes_with(marker)
    try:
        assert len(survivors) == 1
    finally:
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)


def test_exhaust_processes(tmp_path):
    """300 processes at once: more than the sandbox's limit (256 processes and threads)."""
    escape = """
        for _ in range(300):
            if os.fork() == 0:
                import time
                time.sleep(3)
                os._exit(0)
        print("forked 300", flush=True)
    """
    failed_cleanly(run(tmp_path, "nproc", escape, CONFINED), "BlockingIOError")
    control = run(tmp_path, "nproc", escape, UNCONFINED)  # negative control: nothing stops the 300
    assert control.verdict == "NUMERICAL_PASS" and "forked 300" in control.ops[0].candidate_output


def test_a_fork_bomb_is_bounded_and_ends_in_a_clean_fail(tmp_path):
    """Every process forks until the limit says no; the run still ends, promptly, in a FAIL."""
    escape = "while True:\n    os.fork()\n"
    failed_cleanly(run(tmp_path, "bomb", escape, CONFINED), "BlockingIOError")


def test_nothing_of_the_host_is_visible(tmp_path):
    """The checkout, the host's /tmp and the real bundle are absent; home holds at most the path down
    to the interpreter's prefix; every mount is read-only; the uid is unprivileged."""
    checkout = Path(__file__).resolve().parents[2]
    probe = f"""
        home = {str(Path.home())!r}
        seen = [p for p in ({str(checkout)!r}, {str(tmp_path)!r}, "/work", "/etc/passwd") if os.path.exists(p)]
        listed = sorted(os.listdir(home)) if os.path.isdir(home) else []
        writable = [p for p in ("/cacheon/bundle", "/cacheon/lib/cacheon", sys.prefix, "/usr/lib") if os.access(p, os.W_OK)]
        print("SEEN", seen, "HOME", listed, "WRITABLE", writable, "UID", os.getuid(), "CWD", os.getcwd(), flush=True)
    """
    report = run(tmp_path, "probe", probe, CONFINED)
    output = report.ops[0].candidate_output
    home = Path.home()
    prefix = Path(os.path.realpath(sys.base_prefix))
    allowed = [prefix.relative_to(home).parts[0]] if prefix.is_relative_to(home) else []
    assert f"SEEN [] HOME {allowed} WRITABLE [] UID 65534 CWD /tmp" in output, output


def _cli_env_without_bwrap(tmp_path: Path, fake: str | None = None) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if fake is not None:
        script = bin_dir / "bwrap"
        script.write_text(fake)
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": str(bin_dir)}


def test_verify_refuses_without_bubblewrap_unless_told(cli, tmp_path):
    env = _cli_env_without_bwrap(tmp_path)
    refused = cli("verify", str(EXAMPLES / "silu-torch"), env=env)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "bubblewrap (bwrap) is not installed" in refused.stderr and "apt-get install bubblewrap" in refused.stderr
    assert "--confinement none" in refused.stderr
    ran = cli("verify", str(EXAMPLES / "silu-torch"), "--dtype", "float32", "--confinement", "none", "--json", env=env)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["confinement"] == "none" and report["ops"][0]["confinement"]["confinement"] == "none"


def test_a_bubblewrap_that_cannot_create_namespaces_is_named(cli, tmp_path):
    env = _cli_env_without_bwrap(tmp_path, "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\n"
                                           "exit 1\n")
    env["PATH"] += ":/usr/bin:/bin"
    refused = cli("verify", str(EXAMPLES / "silu-torch"), env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "No permissions to creating new namespace" in refused.stderr and "apt-get install bubblewrap" in refused.stderr


def test_unconfined_evidence_is_marked_and_never_counts(cli, tmp_path):
    env = {"CACHEON_LEDGER": str(tmp_path / "ledger.sqlite3")}
    faithful = cli("verify", str(EXAMPLES / "rmsnorm-torch"), "--dtype", "float32", "--confinement", "none",
                   "--record", "--control", "faithful", env=env)
    broken = cli("verify", str(EXAMPLES / "rmsnorm-broken-no-norm"), "--dtype", "float32", "--record",
                 "--control", "broken", env=env)
    assert (faithful.returncode, broken.returncode) == (0, 2), faithful.stderr + broken.stderr
    assert "confinement: none" in faithful.stdout
    records = json.loads(cli("evidence", "list", "--json", env=env).stdout)
    shown = {r["details"]["control"]: r["details"]["confinement"] for r in records["records"]}
    assert shown == {"faithful": "none", "broken": "bubblewrap"}
    [identity] = json.loads(cli("pin", "status", "--json", env=env).stdout)["identities"]
    gate = {g["key"]: g for g in identity["gates"]}["negative-controls"]
    assert gate["status"] == "missing" and "no faithful bundle passing" in gate["reason"], gate


def test_candidate_text_is_escaped_and_tracebacks_need_debug(cli, tmp_path):
    root = write_bundle(tmp_path, "activation.silu_and_mul", "silu_and_mul", textwrap.dedent("""
        print("\\x1b[2J\\x1b[31mPASS\\r", flush=True)


        def silu_and_mul(x, out):
            raise ValueError("\\x1b]0;owned\\x07 \\u202egnp.txe")
    """))
    result = cli("verify", str(root))
    assert_verdict(result, 2, "FAIL", "entry raised: ValueError: \\x1b]0;owned\\x07 \\u202egnp.txe")
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout and "\r" not in result.stdout
    assert "\\x1b[2J\\x1b[31mPASS\\x0d" in result.stdout  # the candidate's output, shown escaped
    raising = write_bundle(tmp_path / "import", "activation.silu_and_mul", "silu_and_mul",
                           "raise RuntimeError('boom at import')\n\n\ndef silu_and_mul(x, out):\n    pass\n")
    plain = cli("verify", str(raising))
    assert_verdict(plain, 2, "FAIL", "candidate import_error: RuntimeError: boom at import")
    assert "Traceback" not in plain.stdout
    debug = cli("verify", str(raising), "--debug")
    assert debug.returncode == 2 and "Traceback (most recent call last)" in debug.stdout
    assert "Traceback" not in cli("verify", str(raising), "--json").stdout
    assert "Traceback" in json.loads(cli("verify", str(raising), "--json", "--debug").stdout)["ops"][0]["detail"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("raise SystemExit(0)\n\n\ndef silu_and_mul(x, out):\n    pass\n", "candidate import_error: SystemExit: 0"),
        ("raise KeyboardInterrupt\n\n\ndef silu_and_mul(x, out):\n    pass\n",
         "candidate import_error: KeyboardInterrupt"),
        ("def silu_and_mul(x, out):\n    raise KeyboardInterrupt\n", "entry raised: KeyboardInterrupt"),
        ("def silu_and_mul(x, out):\n    raise GeneratorExit('x')\n", "entry raised: GeneratorExit: x"),
    ],
)
def test_any_base_exception_is_a_one_line_fail(cli, tmp_path, body, reason):
    root = write_bundle(tmp_path, "activation.silu_and_mul", "silu_and_mul", body)
    assert_verdict(cli("verify", str(root)), 2, "FAIL", reason)


def test_a_nested_user_namespace_cannot_mount_a_tmpfs_of_its_own(tmp_path, monkeypatch):
    """The found attack: a nested user namespace mounts a tmpfs past the sandbox's cap and fills it.
    Each guard alone stops it (the filter at unshare, the disabled namespaces at ENOSPC)."""
    escape = LIBC + f"""
    def attack():
        unshare({CLONE_NEWUSER | CLONE_NEWNS})
        become_root_of()
        os.mkdir("/tmp/nested")
        if libc.mount(b"none", b"/tmp/nested", b"tmpfs", 0, b"size=12g") != 0:
            raise OSError(ctypes.get_errno(), "mount refused")
        with open("/tmp/nested/fill", "wb") as fh:
            for _ in range(16):
                fh.write(bytes(1 << 20))
        print("NESTED TMPFS", os.statvfs("/tmp/nested").f_blocks * 4096 >> 30, "GiB", flush=True)
    forked(attack)
    """
    failed_cleanly(run(tmp_path, "userns", escape, CONFINED), "unshare: Operation not permitted")
    guarded(monkeypatch, seccomp=False)
    failed_cleanly(run(tmp_path, "userns", escape, CONFINED), "unshare: No space left on device")
    guarded(monkeypatch, seccomp=False, userns=False)  # negative control: both guards off
    control = run(tmp_path, "userns", escape, CONFINED)
    assert control.verdict == "NUMERICAL_PASS", control.reason
    assert "NESTED TMPFS 12 GiB" in control.ops[0].candidate_output


@pytest.mark.parametrize("call", ["syscall('keyctl', 0, -2, 1)", f"unshare({CLONE_NEWPID})",
                                  "os.memfd_create('x')"])
def test_the_filter_refuses_what_kernels_never_need(tmp_path, monkeypatch, call):
    """keyctl (the kernel keyring), a namespace of any kind, a memfd (on CPU): EPERM. Without the
    filter each of them works (unshare needs the nested user namespace the other guard forbids)."""
    prelude = f"unshare({CLONE_NEWUSER}); become_root_of(); " if "unshare" in call else ""
    escape = LIBC + f"\n    forked(lambda: {call})\n    print('ALLOWED', flush=True)\n"
    failed_cleanly(run(tmp_path, "seccomp", escape, CONFINED), "Operation not permitted")
    escape = LIBC + f"\n    def attack():\n        {prelude}{call}\n    forked(attack)\n    print('ALLOWED', flush=True)\n"
    guarded(monkeypatch, seccomp=False, userns=False)  # negative control
    control = run(tmp_path, "seccomp", escape, CONFINED)
    assert control.verdict == "NUMERICAL_PASS" and "ALLOWED" in control.ops[0].candidate_output, control.reason


def test_memory_is_bounded_across_the_whole_tree(tmp_path, monkeypatch):
    """Four processes of 160 MiB each: every one under its own limits, together past the sandbox's."""
    escape = """
        import time
        children = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                block = bytearray(160 << 20)
                time.sleep(3)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        print("HELD 640 MiB", flush=True)
    """
    held_only_unbounded(tmp_path, monkeypatch, "aggregate", escape, "HELD 640 MiB")


def held_only_unbounded(tmp_path, monkeypatch, name, escape, marker, **guards):
    """The escape fails past the 512 MiB aggregate bound; with the bound off (the negative control)
    it runs to ``marker``. ``guards``: other guards switched off for both runs."""
    guarded(monkeypatch, **guards)
    failed_cleanly(run(tmp_path, name, escape, CONFINED, SMALL), "past the aggregate bound of 512 MiB")
    guarded(monkeypatch, **guards, aggregate=False)  # negative control
    control = run(tmp_path, name, escape, CONFINED, SMALL)
    assert control.verdict == "NUMERICAL_PASS" and marker in control.ops[0].candidate_output


@pytest.mark.parametrize("keep", ["held.append(fd)", "held.append(libc.mmap(None, 4096, 1, 1, fd, 0)); os.close(fd)"],
                         ids=["open", "mapped-and-closed"])
def test_memfds_count_against_the_bound(tmp_path, monkeypatch, keep):
    """Memory no process has resident (memfds written, never touched through a mapping), where the
    filter allows memfd_create (CUDA): the bound counts it, open or kept only by a one-page mapping
    after its fd is closed. Each memfd stays under the file-size rlimit."""
    escape = f"""
        import ctypes, time
        libc = ctypes.CDLL(None)
        libc.mmap.restype = ctypes.c_void_p  # PROT_READ, MAP_SHARED: no fd stays open (Python's mmap dups one)
        held = []
        for _ in range(4):
            fd = os.memfd_create("x")
            for _ in range(160):
                os.write(fd, bytes(1 << 20))
            {keep}
        time.sleep(1)
        print("HELD 640 MiB of memfds", flush=True)
    """
    held_only_unbounded(tmp_path, monkeypatch, "memfd", escape, "HELD 640 MiB", seccomp=False)


def test_socket_buffers_count_against_the_bound(tmp_path, monkeypatch):
    """Data queued in unix sockets is kernel memory, no process's: four processes hold ~90 MiB
    each that way (with torch's pages shared, their PSS is far under the bound)."""
    escape = """
        import socket, time
        children = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                pairs = [socket.socketpair() for _ in range(400)]
                for a, _ in pairs:
                    a.setblocking(False)
                    try:
                        while True:
                            a.send(bytes(65536))
                    except BlockingIOError:
                        pass
                time.sleep(3)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)
        print("QUEUED", flush=True)
    """
    held_only_unbounded(tmp_path, monkeypatch, "sockets", escape, "QUEUED")


def test_a_process_in_a_nested_pid_namespace_is_counted(tmp_path, monkeypatch):
    """With the namespace guards off, a process hides in a PID namespace of its own and outlives the
    run: the census by descent finds it; a census of the sandbox's PID namespace does not."""
    marker = f"cacheon-hidden-{uuid.uuid4().hex}"
    escape = LIBC + f"""
    pid = os.fork()
    if pid == 0:
        unshare({CLONE_NEWUSER | CLONE_NEWPID})
        become_root_of()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", {marker!r}])
        os._exit(0)
    os.waitpid(pid, 0)
    """
    guarded(monkeypatch, seccomp=False, userns=False)
    failed_cleanly(run(tmp_path, "hidden", escape, CONFINED), "left 1 process(es) running in the sandbox")
    assert _processes_with(marker) == []  # killed with the sandbox
    monkeypatch.setattr(Launch, "processes", lambda self: processes_in(self.pid_namespace))  # the old census
    assert run(tmp_path, "hidden", escape, CONFINED).verdict == "NUMERICAL_PASS"  # negative control
    assert _processes_with(marker) == []
