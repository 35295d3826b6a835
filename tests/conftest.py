"""Shared test helpers: the repository layout and a way to run the real CLI in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "bundles"

# The simulators load each release's publisher code from the unpacked wheels (tests/interop does too).
os.environ.setdefault("SGLANG_RELEASES_DIR", str(REPO / ".sglang"))


def run_cli(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m cacheon.cli ARGS`` exactly as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "cacheon.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


def write_bundle(root: Path, slot: str, entry: str, source: str, dtypes: str = '["float32"]') -> Path:
    """A one-op bundle at ``root`` whose kernels/k.py is ``source``."""
    (root / "kernels").mkdir(parents=True)
    (root / "manifest.toml").write_text(
        f'bundle_id = "probe"\nabi_version = "cacheon-op-abi-v1"\n[[ops]]\nslot = "{slot}"\n'
        f'source = "kernels/k.py"\nentry = "{entry}"\ndtypes = {dtypes}\n'
    )
    (root / "kernels" / "k.py").write_text(source)
    return root


HEARTBEAT = re.compile(r"^verifying \S+: .*  \d+:\d\d$")  # cacheon/commands/_progress.py, off a terminal


def assert_verdict(result: subprocess.CompletedProcess, code: int, verdict: str, text: str) -> None:
    """A `cacheon verify` run ended with ``code``, its last line names ``verdict``, ``text`` appears.
    Off a terminal verify's status comes as heartbeat lines on stderr (``<status>  m:ss``): not the verdict."""
    out = result.stdout + result.stderr
    assert result.returncode == code, out
    said = result.stdout.splitlines() + [line for line in result.stderr.splitlines() if not HEARTBEAT.search(line)]
    assert [line for line in said if line.strip()][-1].startswith(verdict + " "), out
    assert text in out, out
    assert "Traceback" not in result.stderr


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The simulator's built-in tokenizer and chat template (tests/gateway, tests/sim, tests/tokens)."""
    from cacheon.sim.tokenizer import write_profile

    return write_profile(tmp_path_factory.mktemp("tok"))


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: -p no:xdist still runs the suite
def pytest_xdist_make_scheduler(config, log):
    """xdist's ``load``, except that tests/engines runs on one worker (its tests share real servers)."""
    from tests.engines.scheduling import EnginesOnOneWorker

    return EnginesOnOneWorker(config, log)


def pytest_sessionstart(session: pytest.Session) -> None:
    from tests.engines.scheduling import mark_session_start

    mark_session_start(session.config)


def pytest_terminal_summary(terminalreporter, config) -> None:
    from tests.engines.scheduling import summarize

    summarize(terminalreporter, config)
