"""The bubblewrap command line the verifier builds: what is bound, what is not, and the CUDA path.

The CUDA variant (``/dev/nvidia*`` nodes, ``/usr`` for Triton's compiler) cannot run on this
CPU-only host; these tests pin the argv it would run with.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import cacheon
from cacheon.verify import sandbox, syscall_filter
from cacheon.verify.sandbox import BUNDLE_MOUNT, LIB_MOUNT, SITE_MOUNT, Mounts, bwrap_argv

MOUNTS = Mounts(
    interpreter="/opt/py/bin/python3.11", prefixes=("/opt/py",),
    site=("/home/dev/proj/.venv/lib/python3.11/site-packages",), package="/home/dev/proj/src/cacheon",
)


def pairs(argv: list[str], flag: str, width: int = 2) -> list[tuple[str, ...]]:
    return [tuple(argv[i + 1 : i + 1 + width]) for i, a in enumerate(argv) if a == flag]


def test_only_the_interpreter_libraries_site_package_and_bundle_are_bound_read_only():
    argv = bwrap_argv(MOUNTS, "/tmp/cacheon-verify-x/bundle", "cpu", 1 << 30, as_root=True, info_fd=5, block_fd=6)
    assert argv[1:6] == ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--info-fd"]
    binds = pairs(argv, "--ro-bind")
    sources = {s for s, _ in binds}
    assert ("/opt/py", "/opt/py") in binds
    assert (MOUNTS.site[0], f"{SITE_MOUNT}/0") in binds
    assert (MOUNTS.package, f"{LIB_MOUNT}/cacheon") in binds  # the package alone, never the checkout
    assert ("/tmp/cacheon-verify-x/bundle", BUNDLE_MOUNT) in binds
    assert "/home/dev/proj" not in sources and "/home/dev" not in sources and "/tmp" not in sources
    assert all(s.startswith(("/usr/lib", "/lib", "/opt/py", "/home/dev/proj/.venv/", MOUNTS.package, "/tmp/cacheon-"))
               for s in sources), sources
    assert not pairs(argv, "--bind") and not pairs(argv, "--dev-bind")
    assert pairs(argv, "--tmpfs", 1) == [("/tmp",), ("/dev/shm",)]
    assert pairs(argv, "--size", 1) == [(str(1 << 30),)] * 2  # every writable tmpfs is sized
    assert pairs(argv, "--remount-ro", 1) == [("/dev",)]  # bubblewrap's /dev tmpfs has no size
    assert ("/tmp",) in pairs(argv, "--chdir", 1) and "--share-net" not in argv


def test_a_prefix_under_tmp_is_bound_on_top_of_the_private_tmp_not_hidden_by_it():
    """A server venv (or an interpreter) under /tmp is bound at its own path: after the /tmp tmpfs, or the tmpfs
    would cover it and the sandbox could not exec it (a checkout under /tmp failed every confined server so)."""
    under_tmp = Mounts(interpreter="/tmp/ci/.engines/v/bin/python3.11", prefixes=("/opt/py", "/tmp/ci/.engines/v"),
                       site=MOUNTS.site, package=MOUNTS.package)
    argv = bwrap_argv(under_tmp, "/b", "cpu", 1 << 30, as_root=True, info_fd=5, block_fd=6)
    tmpfs = next(i for i, a in enumerate(argv) if a == "--tmpfs" and argv[i + 1] == "/tmp")
    bind = next(i for i, a in enumerate(argv) if a == "--ro-bind" and argv[i + 1] == "/tmp/ci/.engines/v")
    assert tmpfs < bind
    assert ("/tmp",) not in pairs(argv, "--dir", 1)  # the tmpfs is not re-made (and re-permissioned) as a parent


def test_root_keeps_only_setuid_and_setgid_for_the_childs_own_drop():
    root = bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=True, info_fd=5, block_fd=6)
    assert pairs(root, "--userns-block-fd", 1) == [("6",)]
    assert pairs(root, "--cap-drop", 1) == [("ALL",)]
    assert pairs(root, "--cap-add", 1) == [("CAP_SETUID",), ("CAP_SETGID",)]
    user = bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=False, info_fd=5)
    assert "--cap-add" not in user and pairs(user, "--uid", 1) == [("65534",)] and pairs(user, "--gid", 1) == [("65534",)]


def test_every_mount_point_parent_is_traversable():
    argv = bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=True, info_fd=5, block_fd=6)
    dirs = [argv[i + 3] for i, a in enumerate(argv) if a == "--perms" and argv[i + 2] == "--dir"]
    assert {"/cacheon", "/cacheon/site", "/cacheon/lib"} <= set(dirs)
    assert all(argv[argv.index(d) - 2] == "0755" for d in dirs)


def test_cuda_binds_the_gpu_nodes_and_nothing_else_of_dev(monkeypatch):
    nodes = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    monkeypatch.setattr(sandbox.glob, "glob", lambda pattern: [*nodes, "/dev/nvidia-caps"])
    isdir = os.path.isdir
    monkeypatch.setattr(sandbox.os.path, "isdir", lambda p: p == "/dev/nvidia-caps" or isdir(p))
    found = sandbox.nvidia_device_nodes()
    assert found == sorted(nodes)
    argv = bwrap_argv(MOUNTS, "/b", "cuda", 1, as_root=True, info_fd=5, block_fd=6, nvidia_nodes=found)
    assert pairs(argv, "--dev-bind") == [(n, n) for n in sorted(nodes)]
    assert ("/usr", "/usr") in pairs(argv, "--ro-bind")  # Triton compiles its launcher with the host's cc
    cpu = bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=True, info_fd=5, block_fd=6)
    assert not pairs(cpu, "--dev-bind") and ("/usr", "/usr") not in pairs(cpu, "--ro-bind")


def test_this_interpreter_mounts_the_package_not_the_checkout():
    mounts = Mounts.of_this_interpreter()
    assert mounts.package == os.path.realpath(Path(cacheon.__file__).parent)
    assert Path(mounts.interpreter) == Path(os.path.realpath(sys.executable))
    assert any(mounts.interpreter.startswith(p + os.sep) for p in mounts.prefixes)
    checkout = Path(__file__).resolve().parents[2]
    assert str(checkout) not in mounts.prefixes and str(checkout) not in mounts.site
    assert mounts.child_paths()[0] == LIB_MOUNT


def test_nested_user_namespaces_are_disabled_and_asserted():
    user = bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=False, info_fd=5)
    assert "--disable-userns" in user and "--assert-userns-disabled" in user
    # as root bubblewrap refuses --disable-userns beside a block fd: the verifier sets the sysctl itself
    root = bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=True, info_fd=5, block_fd=6)
    assert "--disable-userns" not in root and "--assert-userns-disabled" in root
    off = bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=False, info_fd=5, disable_userns=False)
    assert "--disable-userns" not in off and "--assert-userns-disabled" not in off


def test_the_seccomp_filter_is_passed_by_fd():
    argv = bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=True, info_fd=5, block_fd=6, seccomp_fd=7)
    assert pairs(argv, "--seccomp", 1) == [("7",)]
    assert "--seccomp" not in bwrap_argv(MOUNTS, "/b", "cpu", 1, as_root=True, info_fd=5, block_fd=6)


def test_the_filter_policy_is_per_device_and_per_architecture(monkeypatch):
    assert "memfd_create" in syscall_filter.refused("cpu") and "memfd_create" not in syscall_filter.refused("cuda")
    assert {"unshare", "setns", "mount", "keyctl", "bpf", "ptrace", "io_uring_setup"} <= set(syscall_filter.refused("cuda"))
    monkeypatch.setattr(syscall_filter.platform, "machine", lambda: "riscv64")
    with pytest.raises(syscall_filter.FilterUnavailable, match="no seccomp policy for riscv64"):
        syscall_filter.machine_arch()
