"""The event plane's failures: the NATS server restarts, a relay dies, a gateway loses the plane,
the stream's retention is shorter than a replica's downtime."""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cacheon.sim.launch import SimProcess, wait_until
from tests.fleet.fleetkit import RelayThread, drive, plane_gateway, ready
from tests.gateway.agreement import agreed, digests

pytestmark = [pytest.mark.timeout(120)]



def _sims(stack: ExitStack, tmp_path: Path, profile: tuple[Path, Path], n: int = 1) -> list[str]:
    sims = [SimProcess(stack, tmp_path, profile, "0.5.23") for _ in range(n)]
    for s in sims:
        s.ready()
    return [s.url for s in sims]


def _blocks(gw, urls: list[str]) -> int:
    return sum(gw.status()[u]["indexed_blocks"] for u in urls)


def test_the_nats_server_restarts(loop, tmp_path, profile, nats_own, plane_names) -> None:
    plane = {"url": nats_own.url, **plane_names}
    with ExitStack() as stack:
        urls = _sims(stack, tmp_path, profile)
        relay = RelayThread(plane, urls, "r1")
        stack.callback(relay.close)
        gws = [plane_gateway(loop, tmp_path, profile, urls, plane) for _ in range(2)]
        for gw in gws:
            stack.callback(gw.close)
            wait_until(lambda gw=gw: ready(gw, urls), "READY through the plane", 30)
        drive(gws[0], 4, 0)
        before = wait_until(lambda: agreed(gws, urls), f"agreement: {digests(gws, urls)}", 15)

        nats_own.restart()  # the stream is on disk: it survives; clients reconnect on their own
        drive(gws[1], 4, 4)  # within staleness_s: routing goes on, on what each replica has
        after = wait_until(lambda: (a := agreed(gws, urls)) and a != before and a,
                           f"agreement after the restart: {digests(gws, urls)} {relay.status()}", 20)
        assert after[urls[0]][1] > before[urls[0]][1]


def test_a_dead_relays_workers_go_to_another(loop, tmp_path, profile, nats_shared, plane_names) -> None:
    plane = {"url": nats_shared.url, **plane_names}
    with ExitStack() as stack:
        urls = _sims(stack, tmp_path, profile, 2)
        first = RelayThread(plane, urls, "first")
        wait_until(lambda: len(first.status()["workers"]) == 2, "the first relay to take both workers", 10)
        second = RelayThread(plane, urls, "second")
        stack.callback(second.close)
        time.sleep(1.0)
        assert second.status()["workers"] == {}  # the leases are held: it waits
        gw = plane_gateway(loop, tmp_path, profile, urls, plane)
        stack.callback(gw.close)
        wait_until(lambda: ready(gw, urls), "READY through the plane", 30)
        drive(gw, 3, 0)
        held = wait_until(lambda: (n := _blocks(gw, urls)) and n, "blocks indexed", 10)

        first.kill()  # no lease released: it expires
        wait_until(lambda: len(second.status()["workers"]) == 2, "the second relay to take both workers", 15)
        drive(gw, 3, 3)
        wait_until(lambda: _blocks(gw, urls) > 0 and gw.status()[urls[0]]["last_seq"], "events again", 10)
        assert httpx.get(f"{gw.url}/readyz", timeout=5).json()["event_plane"]["stale_workers"] == []
        assert held > 0


def _stale_gauge(gw) -> dict[str, float]:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "cacheon_worker_kv_stale"]
    return {s.labels["worker"]: s.value for s in family.samples}


def test_a_gateway_that_loses_the_plane_routes_on_what_it_has_then_stops(
        loop, tmp_path, profile, nats_own, plane_names) -> None:
    plane = {"url": nats_own.url, "staleness_s": 1.5, **plane_names}
    with ExitStack() as stack:
        urls = _sims(stack, tmp_path, profile)
        relay = RelayThread(plane, urls, "r1")
        stack.callback(relay.close)
        gw = plane_gateway(loop, tmp_path, profile, urls, plane)
        stack.callback(gw.close)
        wait_until(lambda: ready(gw, urls), "READY through the plane", 30)
        drive(gw, 2, 0)
        assert _stale_gauge(gw) == {"w0": 0.0}

        nats_own.stop()
        detail = wait_until(lambda: (d := httpx.get(f"{gw.url}/readyz", timeout=5).json())["event_plane"][
            "index_stale"] and d, "the plane to be missed", 10)
        assert detail["event_plane"]["connected"] is False
        drive(gw, 1, 2)  # within the bound: still routed, on the index it has
        wait_until(lambda: httpx.get(f"{gw.url}/readyz", timeout=5).status_code == 503, "not ready", 10)
        assert httpx.get(f"{gw.url}/readyz", timeout=5).json()["event_plane"]["stale_workers"] == [urls[0]]
        assert _stale_gauge(gw) == {"w0": 1.0}
        r = httpx.post(f"{gw.url}/v1/completions", json={"model": "demo", "prompt": "hi", "max_tokens": 1}, timeout=10)
        assert r.status_code == 503, r.text  # never routed on a worker not heard from within staleness_s

        nats_own.start()
        wait_until(lambda: httpx.get(f"{gw.url}/readyz", timeout=5).status_code == 200, "ready again", 20)
        assert _stale_gauge(gw) == {"w0": 0.0}
        drive(gw, 1, 3)


async def _first_seq(url: str, stream: str) -> tuple[int, int]:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(stream)
        return int(info.state.first_seq), int(info.state.messages)
    finally:
        await nc.close()


def test_retention_shorter_than_a_replicas_downtime_falls_back_to_the_snapshot(
        loop, tmp_path, profile, nats_shared, plane_names) -> None:
    plane = {"url": nats_shared.url, **plane_names}
    with ExitStack() as stack:
        urls = _sims(stack, tmp_path, profile)
        relay = RelayThread(plane, urls, "r1", retention_s=1.0)
        stack.callback(relay.close)
        gw = plane_gateway(loop, tmp_path, profile, urls, plane)
        stack.callback(gw.close)
        wait_until(lambda: ready(gw, urls), "READY through the plane", 30)
        drive(gw, 4, 0)
        wait_until(lambda: agreed([gw], urls), "blocks", 10)
        # Everything published so far ages out of the stream; the snapshot still has it.
        wait_until(lambda: asyncio.run(_first_seq(nats_shared.url, plane["stream"]))[1] == 0, "the stream to expire", 10)
        late = plane_gateway(loop, tmp_path, profile, urls, plane)
        stack.callback(late.close)
        wait_until(lambda: agreed([gw, late], urls), f"the late replica from the snapshot: {digests([gw, late], urls)}",
                   15)
        assert httpx.get(f"{late.url}/readyz", timeout=5).json()["event_plane"]["snapshots_loaded"] == 1
