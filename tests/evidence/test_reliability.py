"""Real processes on one ledger file: concurrent appends lose nothing; SIGKILL leaves no partial batch."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

from cacheon.evidence.ledger import Ledger

from .conftest import child_env

WRITER = str(Path(__file__).with_name("_writer.py"))


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path, start = tmp_path / "shared.sqlite3", tmp_path / "go"
    writers, per_writer = 4, 40
    procs = [
        subprocess.Popen(
            [sys.executable, WRITER, "append", str(path), f"w{w}", str(per_writer), str(start)],
            env=child_env(),
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(writers)
    ]
    start.touch()  # release them together; the first ones also race to create the schema
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    with Ledger.open(path) as ledger:
        subjects = Counter(r.subject for r in ledger.verified().records())
    expected = {f"bundle:w{w}-{i}" for w in range(writers) for i in range(per_writer)}
    assert set(subjects) == expected
    assert set(subjects.values()) == {1}


def test_sigkill_mid_batch_leaves_no_partial_record(tmp_path: Path) -> None:
    path = tmp_path / "killed.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, WRITER, "batch-then-hang", str(path), "10"],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "MID-BATCH", proc.stderr.read() if proc.stderr else line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with Ledger.open(path) as ledger:  # a new writer must be able to proceed after the crash
        assert [r.subject for r in ledger.verified().records()] == ["bundle:committed-before"]
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
