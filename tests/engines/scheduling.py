"""Test-run plumbing for the engine tier: one xdist worker for all of it, and its summary line.

The tier's tests share one session pool of real servers, so they must run in one worker: with
xdist's ``load`` they would split across both, each starting its own servers (twice the memory and
start-ups). ``xdist_group`` cannot do it here: pytest 9 derives node ids without the suffix
pytest-xdist 3.8 appends, so ``--dist loadgroup`` groups nothing. The scheduler below is ``load`` for
every other test (each its own work unit) and one work unit for tests/engines.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.engines.server import ENGINES_DIR

ENGINE_TESTS = "tests/engines/"
SUMMARY = ENGINES_DIR / "last-session.json"  # written by the pool, read by the controller
STARTED = pytest.StashKey[float]()


class EnginesOnOneWorker(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return ENGINE_TESTS if nodeid.startswith(ENGINE_TESTS) else nodeid


def mark_session_start(config: pytest.Config) -> None:
    config.stash[STARTED] = time.time()


def summarize(terminalreporter: Any, config: pytest.Config) -> None:
    """Start-up and memory of every server this run started."""
    try:
        if SUMMARY.stat().st_mtime < config.stash.get(STARTED, 0):
            return
        starts = json.loads(SUMMARY.read_text())
    except (OSError, ValueError):
        return
    if not starts:
        return
    terminalreporter.section("real SGLang servers (CPU)")
    for start in starts:
        terminalreporter.write_line(
            f"{start['server']:<42} start-up {start['startup_s']:5.1f} s   RSS {start['rss_mib'] / 1024:4.2f} GiB"
        )
