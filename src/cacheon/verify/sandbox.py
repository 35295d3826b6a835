"""Confinement of the candidate's process, applied in the child before candidate code is imported.

What the platform allows, and a plain statement of what it does not: a scrubbed environment, a
private working directory and HOME, resource limits (CPU time, address space, open files), stdout
and stderr captured to a file, and no network (a fresh network namespace, when running as root).
"""

from __future__ import annotations

import ctypes
import os
import resource
from dataclasses import dataclass
from typing import Any

CLONE_NEWNET = 0x40000000
#: environment variables a kernel may legitimately need; everything else is dropped
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "CUDA_HOME")
ENV_KEEP_PREFIXES = ("NVIDIA_", "TRITON_")


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 1800
    address_space_bytes: int | None = 32 << 30  # None: no limit (CUDA maps far more virtual memory)
    open_files: int = 1024
    network: bool = False  # collectives keep loopback so their ranks can meet


def _scrub_environment(private: str) -> None:
    kept = {k: v for k, v in os.environ.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    os.environ.clear()
    os.environ.update(kept)
    os.environ.update({"HOME": private, "TMPDIR": private})


def _set_limit(kind: int, value: int) -> str:
    _soft, hard = resource.getrlimit(kind)
    capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(kind, (capped, hard if hard != resource.RLIM_INFINITY else capped))
    return str(capped)


def _new_network_namespace() -> str:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not isolated: a new network namespace needs root"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return f"not isolated: unshare(CLONE_NEWNET) failed ({os.strerror(ctypes.get_errno())})"
    return "isolated: new network namespace without interfaces up"


def confine(private: str, log_path: str, limits: Limits) -> dict[str, Any]:
    """Apply every confinement this host supports; return what was applied, for the report."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(private)
    _scrub_environment(private)
    applied: dict[str, Any] = {"cwd": "private", "environment": "scrubbed", "output": "captured"}
    applied["cpu_seconds"] = _set_limit(resource.RLIMIT_CPU, limits.cpu_seconds)
    applied["open_files"] = _set_limit(resource.RLIMIT_NOFILE, limits.open_files)
    if limits.address_space_bytes is not None:
        applied["address_space_bytes"] = _set_limit(resource.RLIMIT_AS, limits.address_space_bytes)
    else:
        applied["address_space_bytes"] = "not limited (CUDA reserves large virtual ranges)"
    applied["network"] = (
        "not isolated: collective ranks talk over loopback" if limits.network else _new_network_namespace()
    )
    return applied
