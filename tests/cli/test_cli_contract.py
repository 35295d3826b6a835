"""The command line's contract for every command: one line per error, a traceback only on request,
quiet when the reader of its output goes away."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cacheon import cli
from tests.conftest import REPO


def test_a_closed_pipe_ends_quietly():
    """`cacheon slots --json | head -c0`: the reader is gone before the command writes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cacheon.cli", "slots", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 0, err
    assert err == ""


def test_a_user_error_is_one_line_and_debug_shows_the_traceback(cli):
    plain = cli("scan", "/nonexistent/bundle")
    assert plain.returncode == 1
    assert plain.stderr.strip().splitlines() == ["cacheon scan: error: /nonexistent/bundle does not exist"]
    debug = cli("--debug", "scan", "/nonexistent/bundle")
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.rstrip().endswith("cacheon scan: error: /nonexistent/bundle does not exist")


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (PermissionError(13, "Permission denied", "/var/lib/cacheon"), "error: Permission denied: /var/lib/cacheon"),
        (RuntimeError("boom"), "internal error: RuntimeError: boom; rerun with --debug for the traceback"),
    ],
)
def test_environment_problems_and_bugs_are_one_line(monkeypatch, capsys, raised, expected):
    from cacheon.commands import slots

    def explode(_args: object) -> int:
        raise raised

    monkeypatch.setattr(slots, "run", explode)
    assert cli.main(["slots"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"cacheon slots: {expected}" + (" (please report it)" if "internal" in expected else "")]
