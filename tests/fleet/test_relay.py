"""Relays publish the workers' KV batches to JetStream; gateways on the event plane converge on them."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from cacheon.sim.launch import SimProcess, wait_until
from tests.fleet.fleetkit import RelayThread, drive, plane_gateway, ready
from tests.gateway.agreement import agreed, digests
from tests.gateway.inproc import LoopThread

pytestmark = [pytest.mark.timeout(120)]



def test_replicas_converge_through_the_relay_with_no_replay_endpoint(
        loop: LoopThread, tmp_path: Path, profile: tuple[Path, Path], nats_shared, plane_names) -> None:
    plane = {"url": nats_shared.url, **plane_names}
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp_path, profile, v) for v in ("0.5.23", "0.5.13.post1")]
        for s in sims:
            s.ready()
        urls = [s.url for s in sims]
        relay = RelayThread(plane, urls, "r1")
        stack.callback(relay.close)
        gws = [plane_gateway(loop, tmp_path, profile, urls, plane) for _ in range(2)]
        for gw in gws:
            stack.callback(gw.close)
        for gw in gws:
            wait_until(lambda gw=gw: ready(gw, urls), f"the ladder through the plane: {gw.status()}", 30)
        drive(gws[0], 6, 0)
        drive(gws[1], 6, 6)
        before = wait_until(lambda: agreed(gws, urls), f"replicas to agree: {digests(gws, urls)} {gws[0].status()} {relay.status()}", 15)

        # A replica started later loads each worker's snapshot and replays the stream after it.
        late = plane_gateway(loop, tmp_path, profile, urls, plane)
        stack.callback(late.close)
        after = wait_until(lambda: agreed([*gws, late], urls), f"the late replica: {digests([*gws, late], urls)}", 15)
        assert after != before  # the late replica's own ladder challenge added blocks: all three saw them
        assert httpx.get(f"{late.url}/readyz", timeout=5).json()["event_plane"]["snapshots_loaded"] == 2
        for u in urls:
            assert late.status()[u]["kv_replay_port"] is None  # no worker replay endpoint anywhere
