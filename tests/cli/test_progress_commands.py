"""compat, preflight and demo show their status line on a terminal's stderr, and only there: quiet with --json
and off a terminal. The long work itself is stubbed (tests/cli/test_progress.py drives a real verify on a pty)."""

from __future__ import annotations

import json

import pytest

from cacheon.runtime.canary import CanaryReport
from cacheon.runtime.pin import SGLANG_PIN

# command line, a word of its status line
COMMANDS = [
    (("compat",), "checking it against its pin"),
    (("preflight",), "running the compat canary"),
    (("demo", "--workers", "2"), "demo: 2 simulated workers"),
]


@pytest.fixture(autouse=True)
def stubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The three commands' long work, replaced by instant answers."""
    from cacheon.commands import compat, preflight
    from cacheon.sim import demo, releases

    monkeypatch.setattr(compat, "run_canary", lambda *a: CanaryReport("sglang", SGLANG_PIN, SGLANG_PIN, None, ()))
    monkeypatch.setattr(preflight, "static_compatibility",
                        lambda timeout: {"outcome": "pass", "reason": "stubbed", "report": None})
    monkeypatch.setattr(demo, "demo", lambda *a, **k: [])
    monkeypatch.setattr(releases, "unpacked", lambda root, version: True)


@pytest.mark.parametrize(("argv", "status"), COMMANDS, ids=lambda v: v[0] if isinstance(v, tuple) else "")
def test_status_on_a_terminal_stderr_only(cli_main, monkeypatch, argv, status):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: stderr counts as a terminal
    ran = cli_main(*argv)
    assert ran.code in (0, 2), ran.err  # preflight: 2 on a host without a GPU
    assert status in ran.err and status not in ran.out and "\x1b" not in ran.out


@pytest.mark.parametrize(("argv", "status"), COMMANDS, ids=lambda v: v[0] if isinstance(v, tuple) else "")
def test_quiet_with_json_and_off_a_terminal(cli_main, monkeypatch, argv, status):
    plain = cli_main(*argv)  # capsys: not a terminal
    assert status not in plain.err and "\x1b" not in plain.err
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    machine = cli_main(*argv, "--json")
    assert status not in machine.err and "\x1b" not in machine.err
    json.loads(machine.out)
