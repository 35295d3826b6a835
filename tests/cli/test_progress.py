"""Progress of long work: on stderr when it is a terminal (a real pty here), never on stdout, never with --json."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, REPO

pytestmark = pytest.mark.slow  # the CLI and a sandboxed candidate

VERIFY = ("verify", str(EXAMPLES / "moe-torch"), "--case", "float32/r2", "--seed", "3")
STATUS = "verifying moe-torch"  # the status line's text (its spinner frames are the dots around it)


def run_with_terminal_stderr(*argv: str) -> tuple[int, str, str]:
    """The CLI with stderr on a pseudo-terminal and stdout on a pipe: (exit code, stdout, the terminal's bytes)."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "cacheon.cli", *argv], stdout=subprocess.PIPE, stderr=terminal,
                            stdin=subprocess.DEVNULL, cwd=REPO, env={**os.environ, "TERM": "xterm", "COLUMNS": "160"})
    os.close(terminal)
    seen = b""
    while True:  # drain the terminal while the command runs, or its writes would block
        ready, _, _ = select.select([controller], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's last writer closed it
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait(timeout=600)
    os.close(controller)
    return code, out, seen.decode(errors="replace")


def test_progress_shows_on_a_terminal_and_never_on_stdout():
    code, out, terminal = run_with_terminal_stderr(*VERIFY)
    assert code == 0, out + terminal
    assert STATUS in terminal and "calls judged" in terminal  # the status line, updated per judged call
    assert "\x1b" not in out and STATUS + ":" not in out  # stdout: the report's lines only
    assert out.splitlines()[0].startswith("verifying moe-torch sha256:")
    assert out.rstrip().splitlines()[-1].startswith("PASS  moe-torch ")


def test_progress_is_quiet_with_json_and_off_a_terminal():
    code, out, terminal = run_with_terminal_stderr(*VERIFY, "--json")
    assert code == 0 and json.loads(out)["case"] == "float32/r2"
    assert STATUS not in terminal
    piped = subprocess.run([sys.executable, "-m", "cacheon.cli", *VERIFY], capture_output=True, text=True, cwd=REPO,
                           timeout=600)
    assert piped.returncode == 0
    assert all(HEARTBEAT.fullmatch(line) for line in piped.stderr.splitlines()), piped.stderr  # heartbeats only


HEARTBEAT = re.compile(rf"{STATUS}: .* \d+:\d\d")  # off a terminal, the status line every few seconds
NARROWED = ("verify", str(EXAMPLES / "silu-torch"), "--dtype", "float32", "--stability-calls", "40", "--seed", "3")


def test_the_stability_stage_shows_its_own_count_and_a_narrowed_run_says_partial():
    code, out, terminal = run_with_terminal_stderr(*NARROWED)
    assert code == 0, out + terminal
    assert "verifying silu-torch: stability call " in terminal and " of 40" in terminal
    lines = out.rstrip().splitlines()
    assert lines[-2] == ("--dtype float32: a partial verdict, the manifest's other dtypes were not judged "
                         "(activation.silu_and_mul: bfloat16, float16); run without --dtype for the bundle's verdict")
    assert lines[-1].startswith("NUMERICAL_PASS  silu-torch ")
