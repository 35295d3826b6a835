"""Confined servers for the engine tier: ``cacheon.serving.confined`` with the tier's flags.

The server is the pool's release and tiny model, started inside the verify sandbox with the same
flags as every other server of the tier (tests/engines/server.py), and wrapped as an
:class:`EngineServer` so the tier's checks (the activation proof, the gateway's) run against it
unchanged. Its ports are relayed to the host on the same numbers; its processes are in a PID
namespace of their own, so receipts name namespace pids and the census reads that namespace.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cacheon.serving.confined import ConfinedServer, Ports, ServeLimits, ServeRequest, served
from cacheon.sim.launch import free_range
from cacheon.verify.plan import Confinement
from tests.engines.conftest import EnginePool, require_release
from tests.engines.server import (
    BOOT_TIMEOUT_S,
    EngineServer,
    EngineSpec,
    KvFeed,
    release_env,
    serving_flags,
    venv_python,
)


def readable_model(pool: EnginePool, release: str) -> dict[str, Any]:
    """The pool's model, readable by the sandbox's uid (run as root, that uid reads it as "other")."""
    model = pool.model(release, "llama")
    for path in (Path(model["path"]), *Path(model["path"]).rglob("*")):
        extra = stat.S_IROTH | stat.S_IRGRP | ((stat.S_IXOTH | stat.S_IXGRP) if path.is_dir() else 0)
        path.chmod(path.stat().st_mode | extra)
    return model


@dataclass
class ConfinedEngine(EngineServer):
    """A confined server, seen as any server of the tier; stopping it takes its whole sandbox down."""

    confined: ConfinedServer | None = field(default=None)

    def alive(self) -> bool:
        return self.confined is not None and self.confined.alive()

    def kill(self) -> None:  # never EngineServer.kill: bubblewrap shares this test's process group
        if self.confined is not None:
            self.confined.stop()

    def restart(self) -> None:
        raise NotImplementedError("a confined engine is started once")

    def close(self) -> None:
        self.feed.close()
        if self.confined is not None:
            self.confined.close()


def start(
    pool: EnginePool,
    spec: EngineSpec,
    workdir: Path,
    *,
    env: dict[str, str] | None = None,
    confinement: Confinement = Confinement.BUBBLEWRAP,
    test_only_admit_unscanned: bool = False,
    limits: ServeLimits | None = None,
) -> ConfinedEngine:
    require_release(spec.release)
    model = readable_model(pool, spec.release)
    base = free_range(3)  # three distinct ports below the ephemeral range (tests.engines.server says why)
    request = ServeRequest(
        venv_python(spec.release), Path(model["path"]), spec.bundle, Ports(base, base + 1, base + 2),
        tuple(serving_flags(spec)), {**release_env(spec), **(env or {})}, confinement=confinement,
        limits=limits or ServeLimits(), test_only_admit_unscanned=test_only_admit_unscanned,
    )  # fmt: skip
    server = served(request, workdir, BOOT_TIMEOUT_S)
    assert server.process is not None
    engine = ConfinedEngine(
        spec, model, server.url, server.kv_endpoint, server.replay_endpoint, KvFeed(pool.ctx, server.kv_endpoint),
        server.process, server.log_path, server.receipt_dir, env=dict(request.env), confined=server,
    )  # fmt: skip
    info = engine.get("/server_info")
    assert info.get("model_path") == server.model_path and info.get("version") == spec.release, info
    return engine


def namespace_pids(engine: ConfinedEngine, word: str) -> set[int]:
    """The sandbox's own pids (what receipts record) of its processes whose command line has ``word``."""
    assert engine.confined is not None
    found = set()
    for pid in engine.confined.sandbox_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if word in cmdline:
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
            found.add(int(nspid.split()[-1]))
    return found


def host_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
