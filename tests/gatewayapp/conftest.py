from __future__ import annotations

import os
from pathlib import Path

import pytest

# The simulators load each release's publisher code from the unpacked wheels (tests/interop does too).
os.environ.setdefault("SGLANG_RELEASES_DIR", str(Path(__file__).resolve().parents[2] / ".sglang"))

from cacheon.sim.tokenizer import write_profile


@pytest.fixture(scope="session")
def profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_profile(tmp_path_factory.mktemp("tok"))
