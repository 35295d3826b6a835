"""The CPU engine tier: real SGLang servers, shared by every test of the session.

Servers are expensive (~2 GiB and tens of seconds each on 2 cores), so one pool per session starts
each configuration once and keeps at most ``MAX_LIVE`` running, stopping the least recently used
one when another is needed; tests are grouped by server (module-scoped parametrised fixtures) and
all run on one xdist worker (tests/engines/scheduling.py). A missing server venv skips the tier with the reason,
unless ``CACHEON_REQUIRE_ENGINES=1`` (CI sets it): then it fails, never skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.engines.scheduling import SUMMARY
from tests.engines.server import (
    REQUIRE_ENV,
    EngineServer,
    EngineSpec,
    make_model,
    missing_prerequisite,
    missing_vocab,
    start_server,
)

MAX_LIVE = 2  # the etiquette's limit on real servers at once


class EnginePool:
    """Starts servers on demand, one per spec, and remembers how each start went."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ctx = zmq.Context()
        self._live: OrderedDict[EngineSpec, EngineServer] = OrderedDict()
        self._models: dict[tuple[str, str, str | None], dict[str, Any]] = {}
        self.starts: list[dict[str, Any]] = []  # for the session's summary (README figures)

    def get(self, spec: EngineSpec) -> EngineServer:
        server = self._live.get(spec)
        if server is not None and server.alive():
            self._live.move_to_end(spec)
            return server
        if server is not None:  # died since its last use: a fresh one, and say so in the summary
            self._live.pop(spec)
            server.stop()
        while len(self._live) >= MAX_LIVE:
            _, oldest = self._live.popitem(last=False)
            oldest.stop()
        work = Path(tempfile.mkdtemp(prefix=spec.label.replace("/", "_") + "-", dir=self.root))
        server = start_server(spec, work, self.ctx, self.model(spec.release, spec.family, spec.vocab))
        self._live[spec] = server
        self.starts.append({"server": spec.label, "startup_s": server.startup_s, "rss_mib": server.rss_mib})
        return server

    def model(self, release: str, family: str, vocab: str | None = None) -> dict[str, Any]:
        key = (release, family, vocab)
        if key not in self._models:
            name = f"model-{release}-{family}" + (f"-{vocab}" if vocab else "")
            self._models[key] = make_model(release, family, self.root / name, vocab)
        return self._models[key]

    def release(self, spec: EngineSpec) -> None:
        """Stop a server no later test needs (frees its memory for the next one)."""
        server = self._live.pop(spec, None)
        if server is not None:
            server.stop()

    def close(self) -> None:
        while self._live:
            _, server = self._live.popitem()
            server.stop()
        self.ctx.destroy(linger=0)


_POOL: EnginePool | None = None


@pytest.fixture(scope="session")
def engine_pool() -> Iterator[EnginePool]:
    global _POOL
    root = Path(tempfile.mkdtemp(prefix="cacheon-engines-"))
    _POOL = EnginePool(root)
    try:
        yield _POOL
    finally:
        _POOL.close()
        with contextlib.suppress(OSError):
            SUMMARY.parent.mkdir(parents=True, exist_ok=True)
            SUMMARY.write_text(json.dumps(_POOL.starts))
        if not os.environ.get("CACHEON_KEEP_ENGINE_LOGS"):
            shutil.rmtree(root, ignore_errors=True)


def require_release(release: str, vocab: str | None = None) -> None:
    """Skip (or, armed, fail) when this release's server (on the real tokenizer ``vocab``) cannot start here."""
    reason = missing_prerequisite(release) or (missing_vocab(vocab) if vocab else None)
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}", pytrace=False)
    pytest.skip(f"{reason}; or set {REQUIRE_ENV}=1 to fail instead")


def serve(pool: EnginePool, spec: EngineSpec) -> EngineServer:
    require_release(spec.release, spec.vocab)
    return pool.get(spec)
