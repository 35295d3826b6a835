"""Off a terminal, a command that asks for one gets a heartbeat: the status as a line on stderr every
few seconds (in-process: pytest's captured stderr is not a terminal)."""

from __future__ import annotations

import re
import time

import pytest

from cacheon.commands._progress import Progress


def test_a_heartbeat_off_a_terminal_carries_the_latest_status(capsys: pytest.CaptureFixture[str]) -> None:
    with Progress("verifying x: starting", heartbeat_s=0.05) as shown:
        time.sleep(0.12)
        shown.update("verifying x: stability call 7 of 10")
        time.sleep(0.12)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == ""
    assert len(lines) >= 3 and all(re.fullmatch(r"verifying x: .* \d+:\d\d", line) for line in lines), lines
    assert lines[0].startswith("verifying x: starting") and lines[-1].startswith("verifying x: stability call 7 of 10")
    time.sleep(0.12)
    assert capsys.readouterr().err == ""  # the heartbeat stops with the work


@pytest.mark.parametrize("kwargs", [{}, {"heartbeat_s": 0.05, "quiet": True}])
def test_no_heartbeat_unless_asked_and_none_when_quiet(capsys: pytest.CaptureFixture[str], kwargs: dict) -> None:
    with Progress("working", **kwargs):
        time.sleep(0.12)
    assert capsys.readouterr().err == ""
