"""A relay process leaves its start-up heap out of the garbage collector's passes (``gc.freeze``) once it is
connected, as ``cacheon kv relay`` wires it (``commands.kv.freeze_when_connected`` on ``serve``'s ``started``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.timeout(60)]

# In a process of its own: a freeze is for the whole process, and this test's process must not be frozen.
RELAY = textwrap.dedent("""
    import asyncio, gc, sys
    import msgspec
    from cacheon.commands.kv import freeze_when_connected
    from cacheon.gateway.config import RelayConfig
    from cacheon.gateway.relaying import serve

    async def main():
        stop = asyncio.Event()
        started = asyncio.get_running_loop().create_future()
        started.add_done_callback(freeze_when_connected)
        plane = {"url": sys.argv[1], "stream": sys.argv[2], "snapshot_bucket": sys.argv[3]}
        cfg = msgspec.convert({"event_plane": plane, "workers": []}, RelayConfig)
        before = gc.get_freeze_count()
        task = asyncio.create_task(serve(cfg, stop, started))
        await started
        print(before, gc.get_freeze_count(), len(gc.get_objects()))
        stop.set()
        await task

    asyncio.run(main())
""")


def test_a_connected_relay_has_frozen_its_start_up_heap(nats_shared, plane_names) -> None:
    """Every object alive once the relay is connected is frozen, so a full collection later traverses only what
    came after (~50k objects were 25-45 ms of GIL on a small VM: the ZMQ thread and the publisher stopped)."""
    done = subprocess.run([sys.executable, "-c", RELAY, nats_shared.url, plane_names["stream"],
                           plane_names["snapshot_bucket"]], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-2000:]
    before, frozen, tracked = map(int, done.stdout.split())
    assert before == 0 and frozen > 10_000 and tracked < frozen / 4, done.stdout
