"""The CLI's entry function in this process: fast for mistakes that end before any real work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from cacheon.cli import main


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


@pytest.fixture
def cli_main(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """``cli_main("scan", path)``: `cacheon scan PATH` through ``cacheon.cli.main``; argparse's own exits count."""

    def run(*argv: object) -> Ran:
        capsys.readouterr()
        try:
            code = main([str(word) for word in argv])
        except SystemExit as stop:  # argparse: --help (0) and usage errors (1)
            code = stop.code if isinstance(stop.code, int) else 1
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run
