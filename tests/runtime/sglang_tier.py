"""Helpers for tiers that need a real installed package (SGLang at the pin, the Bittensor SDK).

Such a test skips with the reason when the package cannot be imported, unless its ``CACHEON_REQUIRE_*``
variable is ``1`` (CI sets it): then it fails loudly, so a broken install can never pass as a skip.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "bundles"


def import_or_skip(module: str, require_env: str, how_to_install: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except Exception as exc:
        reason = f"{module} cannot be imported ({type(exc).__name__}: {exc})"
        if os.environ.get(require_env) == "1":
            pytest.fail(f"{require_env}=1 but {reason}", pytrace=False)
        pytest.skip(f"{reason}; install it with {how_to_install}, or set {require_env}=1 to fail instead")


def sglang_or_skip() -> ModuleType:
    return import_or_skip("sglang", "CACHEON_REQUIRE_SGLANG", "scripts/install_sglang_pin.sh")


def python_env(extra_path: Path | None = None, **env: str) -> dict[str, str]:
    """The environment for a child interpreter. Cacheon must be *installed* (``pip install -e .``), not
    put on PYTHONPATH: SGLang finds the plugin through the installed distribution's entry points."""
    paths = [*([str(extra_path)] if extra_path else []), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **env}


def start_python(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``python -c CODE`` in the repository root (started, not awaited, so slow imports overlap)."""
    return subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", code],
        cwd=REPO,
        env=env or python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 540) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
