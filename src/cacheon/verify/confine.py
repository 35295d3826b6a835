"""The child's own part of its confinement, applied before any candidate code is imported.

Inside bubblewrap the namespaces and binds are already in place; what is left is done here: when
the verifier runs as root, bubblewrap starts this process as root of the sandbox's user namespace
with only CAP_SETUID/CAP_SETGID, and it switches to the unprivileged uid at once (which clears
every capability). Then the resource limits. A limit can only be lowered, never raised again.
"""

from __future__ import annotations

import os
import resource

from cacheon.verify.messages import BootLimits

#: the capability sets that grant anything to this process (CapBnd only limits what could be gained)
_CAPS = ("CapPrm", "CapEff", "CapAmb")


def drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise PermissionError("the sandboxed child is still root after dropping privileges")


def effective_capabilities() -> str:
    """The CapPrm/CapEff/CapAmb masks of this process (``0`` each when nothing is held)."""
    with open("/proc/self/status", encoding="ascii") as status:
        fields = dict(line.split(":\t", 1) for line in status.read().splitlines() if ":\t" in line)
    return " ".join(f"{k}={int(fields[k], 16):x}" for k in _CAPS if k in fields)


def _set(kind: int, value: int) -> str:
    _soft, hard = resource.getrlimit(kind)
    capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (capped, capped))
    return str(capped)


def apply_limits(limits: BootLimits) -> dict[str, str]:
    """Set every limit ``limits`` names; return what was set, for the report."""
    applied = {
        "cpu_seconds": _set(resource.RLIMIT_CPU, limits.cpu_seconds),
        "file_bytes": _set(resource.RLIMIT_FSIZE, limits.file_bytes),
        "open_files": _set(resource.RLIMIT_NOFILE, limits.open_files),
    }
    if limits.address_space_bytes is not None:
        applied["address_space_bytes"] = _set(resource.RLIMIT_AS, limits.address_space_bytes)
    else:
        applied["address_space_bytes"] = "not limited (CUDA reserves large virtual ranges)"
    if limits.processes is not None:
        applied["processes"] = _set(resource.RLIMIT_NPROC, limits.processes)
    else:
        applied["processes"] = "not limited (unconfined: the limit would count every process of the user)"
    return applied
