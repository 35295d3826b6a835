"""The sandbox's seccomp policy, compiled to BPF by libseccomp for bubblewrap's ``--seccomp FD``.

libseccomp's Python binding is a Debian package (``python3-seccomp``) that lives in the system
interpreter's dist-packages, not in the project's virtual environment, and no maintained PyPI
release of it exists; so the filter is exported by the system ``python3`` running this very file
(stdlib only at the top), and the verifier reads the bytes back. The policy is data here, one place.

What is refused (EPERM) is what a kernel never needs and what widens the host kernel's surface:
namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag; ``clone3`` answers
ENOSYS so the C library falls back to ``clone``, whose flags a filter can read), mounts, the
keyring, BPF, perf events, tracing or reading other processes, kernel modules and kexec,
userfaultfd, io_uring, file handles, System V shared memory, time and host administration, and
sockets of any family but local, IPv4/IPv6 (loopback only: the network namespace is empty) and
route netlink (``getifaddrs``, which gloo calls). On CPU ``memfd_create`` is refused too; CUDA
keeps it (its driver may use one), where the aggregate bound counts it. Syscalls of any other
ABI than the native one (i386 or x32 on x86_64, arm32 on aarch64) kill the process.

It is a deny-list, not an allow-list, on purpose: the set of syscalls the NVIDIA driver and
torch's libraries make is not knowable on a host without a GPU, and a filter that kills the
driver would make the GPU sandbox unusable; what it refuses is whole kernel subsystems.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import subprocess
import sys
from functools import lru_cache

#: the system interpreter that has libseccomp's binding (Debian/Ubuntu: apt-get install python3-seccomp)
SYSTEM_PYTHON = "/usr/bin/python3"
INSTALL_HINT = "apt-get install python3-seccomp"
#: machine name -> libseccomp architecture token; no other architecture gets a sandbox
ARCHES = {"x86_64": "x86_64", "aarch64": "aarch64"}

REFUSED = (
    # namespaces and mounts
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    # the kernel keyring
    "keyctl", "add_key", "request_key",
    # kernel extension and introspection
    "bpf", "perf_event_open", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "lookup_dcookie", "syslog", "fanotify_init",
    # other processes and their memory
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # subsystems a kernel never needs and that are frequent exploit vectors
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at",
    "name_to_handle_at", "memfd_secret", "shmget", "shmat", "shmctl",
    # host administration
    "acct", "swapon", "swapoff", "reboot", "settimeofday", "clock_settime", "clock_adjtime", "quotactl",
    "quotactl_fd", "vhangup", "iopl", "ioperm", "uselib", "personality",
)
#: refused on CPU only (see the module docstring)
REFUSED_ON_CPU = ("memfd_create",)
CLONE_NEW_FLAGS = {
    "CLONE_NEWTIME": 0x80, "CLONE_NEWNS": 0x20000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
#: socket families allowed: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK (NETLINK_ROUTE only)
AF_NETLINK = 16
SOCKET_FAMILIES = (1, 2, 10, AF_NETLINK)
AF_MAX = 64


class FilterUnavailable(Exception):
    """The filter cannot be built here (no libseccomp binding, another architecture)."""


def machine_arch() -> str:
    """The libseccomp token of this machine; refuses any architecture the policy was not written for."""
    machine = platform.machine()
    if machine not in ARCHES:
        raise FilterUnavailable(f"no seccomp policy for {machine} (only {', '.join(ARCHES)})")
    return ARCHES[machine]


def refused(device: str) -> tuple[str, ...]:
    return REFUSED + (REFUSED_ON_CPU if device == "cpu" else ())


@lru_cache(maxsize=4)
def compiled(device: str) -> bytes:
    """The BPF program for ``device`` on this machine (exported once per process)."""
    machine_arch()
    if not os.path.exists(SYSTEM_PYTHON):
        raise FilterUnavailable(f"{SYSTEM_PYTHON} is missing ({INSTALL_HINT})")
    done = subprocess.run([SYSTEM_PYTHON, "-I", os.path.abspath(__file__), json.dumps(refused(device))],
                          capture_output=True, timeout=60, check=False)
    if done.returncode != 0 or not done.stdout:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise FilterUnavailable(f"libseccomp could not build the filter ({message[-1] if message else 'no output'}; "
                                f"{INSTALL_HINT})")
    return done.stdout


def describe(device: str) -> str:
    """One line for the report's confinement record."""
    return (f"{machine_arch()} filter (libseccomp): {len(refused(device))} syscalls, clone with CLONE_NEW* and "
            f"socket families beyond unix/inet/inet6/netlink-route refused; other ABIs killed")


def _export(names: list[str]) -> None:  # pragma: no cover - runs under the system python3
    """Write the BPF for the native architecture (the only one a filter admits) to stdout."""
    import seccomp  # type: ignore[import-not-found]  # the Debian binding; only this interpreter has it

    eperm = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in names:
        try:
            rules.add_rule(eperm, name)
        except RuntimeError:  # not a syscall on this architecture (e.g. iopl on aarch64)
            continue
    for flag in CLONE_NEW_FLAGS.values():
        rules.add_rule(eperm, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for family in range(AF_MAX):
        if family not in SOCKET_FAMILIES:
            rules.add_rule(eperm, "socket", seccomp.Arg(0, seccomp.EQ, family))
    rules.add_rule(eperm, "socket", seccomp.Arg(0, seccomp.GE, AF_MAX))
    rules.add_rule(eperm, "socket", seccomp.Arg(0, seccomp.EQ, AF_NETLINK), seccomp.Arg(2, seccomp.NE, 0))
    rules.export_bpf(sys.stdout)


if __name__ == "__main__":  # pragma: no cover - the system python3, from compiled()
    _export(json.loads(sys.argv[1]))
