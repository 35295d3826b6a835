"""The fleet tier: a real nats-server with JetStream; every test here carries the ``fleet`` mark."""

from __future__ import annotations

import itertools

import pytest

from tests.fleet.natsd import NatsServer
from tests.gateway.inproc import LoopThread

_names = itertools.count()


def pytest_collection_modifyitems(items):
    for item in items:
        if "/tests/fleet/" in str(item.fspath):
            item.add_marker(pytest.mark.fleet)
            # a task destroyed pending (a loop closed under it) is an error here, not noise in a later test's stderr
            item.add_marker(pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"))


@pytest.fixture(scope="session")
def nats_shared(tmp_path_factory):
    """One server for the tests that do not restart it (each uses its own stream names: ``plane_names``)."""
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        yield server


@pytest.fixture
def nats_own(tmp_path):
    """A server of this test's own, for the tests that restart or stop it."""
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.stop()


@pytest.fixture
def plane_names():
    """A stream and a snapshot bucket no other test uses on the shared server."""
    n = next(_names)
    return {"stream": f"KV_T{n}", "snapshot_bucket": f"snap-t{n}"}


@pytest.fixture(scope="module")
def loop():
    """One event loop on a thread per module: in-process gateways and their clients run on it."""
    thread = LoopThread()
    yield thread
    thread.close()
