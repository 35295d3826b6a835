"""Fixtures the gateway test modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.inproc import LoopThread


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    """One event loop on a thread per module: in-process gateways and their clients run on it."""
    thread = LoopThread()
    yield thread
    thread.close()
