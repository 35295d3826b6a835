"""The atheris fuzzer (tests/kv/fuzz_wire.py) for a bounded time on real captured frames."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # a 20 s fuzzing run in a child process
FUZZER = Path(__file__).parent / "fuzz_wire.py"
SECONDS = 20


def test_the_ingest_path_survives_coverage_guided_fuzzing(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(FUZZER), "--seed-corpus", str(corpus)], check=True, timeout=60)
    run = subprocess.run(
        [sys.executable, str(FUZZER), str(corpus), f"-max_total_time={SECONDS}", "-rss_limit_mb=2048",
         "-max_len=65536", f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=SECONDS + 120)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "oom-", "leak-")))
    assert run.returncode == 0 and not crashes, run.stderr[-4000:]
    assert "Done" in run.stderr
