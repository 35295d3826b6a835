"""Shared in-flight load between gateway replicas (``cacheon.fleet.load``) on a real nats-server:
the other replica's policy counts it, a dead replica's load expires, losing the plane leaves a
replica on its own load, and several processes serve one port."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import msgspec
import nats
import pytest
import yaml
from prometheus_client import CollectorRegistry

from cacheon.fleet.load import Batch, LoadShare, Routed
from cacheon.sim.launch import GatewayProcess, ProcessError, SimProcess, free_port, free_range, wait_until
from cacheon.sim.tokenizer import gateway_model
from tests.gateway.inproc import InProcessGateway, LoopThread

pytestmark = pytest.mark.timeout(120)
SLOW_PREFILL = ["--prefill-us-per-token", "3000", "--max-running-requests", "4"]  # ~600 tokens: ~1.8 s
LONG = "The radix cache keeps every prefix it has seen until memory runs short. " * 40



def plane(url: str, stream: str, share: bool = True) -> dict[str, Any]:
    """Load shared on the plane, KV events still from each worker's publisher (what these tests vary is load)."""
    return {"url": url, "stream": stream, "kv_events": "workers", "share_load": share, "load_heartbeat_s": 0.2, "load_expiry_s": 0.6}


def replicas(stack: ExitStack, loop: LoopThread, tmp: Path, profile: tuple[Path, Path], urls: list[str],
             event_plane: dict[str, Any], n: int = 2) -> list[InProcessGateway]:
    """``n`` in-process replicas on the same workers, once every worker is READY on each."""
    made = []
    for _ in range(n):
        gw = InProcessGateway(loop, {"policy": "exact", "models": {"demo": gateway_model(*profile)},
                                     "workers": [{"url": u, "id": f"w{i}"} for i, u in enumerate(urls)],
                                     "event_plane": event_plane, "drain_timeout_s": 1}, tmp)
        stack.callback(gw.close)
        made.append(gw)
    for gw in made:
        wait_until(lambda gw=gw: all(w["ladder"]["state"] == "READY" for w in loop.call(gw.gateway.status())["workers"]),
                   "workers READY", 30)
    return made


def shared(url: str) -> dict[str, Any]:
    detail: dict[str, Any] = httpx.get(f"{url}/readyz", timeout=5).json()["fleet_load"]
    return detail


def ask(url: str, text: str, into: list[httpx.Response] | None = None) -> httpx.Response | None:
    try:
        r = httpx.post(f"{url}/v1/completions", json={"model": "demo", "prompt": text, "max_tokens": 2}, timeout=30)
    except httpx.HTTPError:
        return None  # the replica was killed under it
    if into is not None:
        into.append(r)
    return r


def in_background(url: str, text: str) -> tuple[threading.Thread, list[httpx.Response]]:
    got: list[httpx.Response] = []
    thread = threading.Thread(target=ask, args=(url, text, got), daemon=True)
    thread.start()
    return thread, got


def metric(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


@pytest.mark.parametrize("share", [True, False], ids=["shared", "not-shared"])
def test_the_other_replica_routes_around_remote_load(share: bool, loop: LoopThread, profile: tuple[Path, Path],
                                                     tmp_path: Path, nats_shared: Any, plane_names: dict) -> None:
    """A's long prefill in flight on one worker: B, asked something else, sends it to the other worker
    only when it counts A's load (negative control: without sharing both ties go to the same worker)."""
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp_path, profile, "0.5.23", extra_args=SLOW_PREFILL) for _ in range(2)]
        for s in sims:
            s.ready()
        cfg = plane(nats_shared.url, plane_names["stream"], share)
        a, b = replicas(stack, loop, tmp_path, profile, [s.url for s in sims], cfg)
        if share:
            wait_until(lambda: shared(b.url)["peers"] == 1, "B to hear A", 10)
        thread, got = in_background(a.url, "Document one. " + LONG)
        if share:
            wait_until(lambda: shared(b.url)["remote_in_flight"] == 1, "B to count A's request", 10)
        else:
            time.sleep(0.5)
        mine = ask(b.url, "Document two. " + LONG)
        thread.join(30)
        assert mine is not None and mine.status_code == 200 and got and got[0].status_code == 200
        theirs = got[0].headers["x-cacheon-worker"]
        assert (mine.headers["x-cacheon-worker"] != theirs) is share
        assert metric(b.url, "cacheon_fleet_load_delay_seconds_count") > 0 if share else "fleet_load" not in (
            httpx.get(f"{b.url}/readyz", timeout=5).json())


def test_a_killed_replicas_load_expires(loop: LoopThread, profile: tuple[Path, Path], tmp_path: Path,
                                        nats_shared: Any, plane_names: dict) -> None:
    """A replica killed mid-request never sends the end: the others drop its load within the expiry bound."""
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp_path, profile, "0.5.23", extra_args=SLOW_PREFILL) for _ in range(2)]
        for s in sims:
            s.ready()
        urls = [s.url for s in sims]
        cfg = plane(nats_shared.url, plane_names["stream"])
        (b,) = replicas(stack, loop, tmp_path, profile, urls, cfg, 1)
        a = GatewayProcess(stack, tmp_path, profile, "exact", [{"url": u, "id": f"w{i}"} for i, u in enumerate(urls)],
                           event_plane=cfg)
        a.settled(urls)
        in_background(a.url, "Document three. " + LONG)
        wait_until(lambda: shared(b.url)["remote_in_flight"] == 1, "B to count A's request", 10)
        a.proc.kill()
        a.proc.wait(10)
        killed = time.monotonic()
        wait_until(lambda: shared(b.url)["remote_in_flight"] == 0, "A's load to expire", 10)
        took = time.monotonic() - killed
        assert shared(b.url)["peers"] == 0
        assert metric(b.url, "cacheon_fleet_load_dropped_total", reason="silent") == 1
        print(f"dead replica's load dropped after {took:.2f} s (bound: expiry 0.6 + heartbeat 0.2)")


def test_losing_the_plane_leaves_a_replica_on_its_own_load(loop: LoopThread, profile: tuple[Path, Path],
                                                           tmp_path: Path, nats_own: Any) -> None:
    """The plane goes: remote load is dropped at once, /readyz and the metric say so, requests are still
    routed; it comes back: the peer's request still in flight is published again (resync)."""
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp_path, profile, "0.5.23",
                           extra_args=["--prefill-us-per-token", "5000", "--max-running-requests", "4"])
                for _ in range(2)]
        for s in sims:
            s.ready()
        cfg = plane(nats_own.url, "LOAD")
        a, b = replicas(stack, loop, tmp_path, profile, [s.url for s in sims], cfg)
        wait_until(lambda: shared(b.url)["peers"] == 1, "B to hear A", 10)
        thread, _ = in_background(a.url, "Document four. " + LONG)  # ~6 s of prefill
        wait_until(lambda: shared(b.url)["remote_in_flight"] == 1, "B to count A's request", 10)
        nats_own.stop()
        lost = wait_until(lambda: (d := shared(b.url))["plane"] == "down" and d, "B to see the plane lost", 10)
        assert lost["remote_in_flight"] == 0 and lost["note"] == "routing on this replica's own load only"
        assert metric(b.url, "cacheon_fleet_load_plane_up") == 0
        assert metric(b.url, "cacheon_fleet_load_dropped_total", reason="plane_lost") == 1
        mine, routed = in_background(b.url, "Document five. short")  # routed now, maybe behind A's prefill
        nats_own.restart()
        wait_until(lambda: shared(b.url)["plane"] == "up", "B to see the plane back", 15)
        wait_until(lambda: shared(b.url)["remote_in_flight"] == 1, "A's request published again", 10)
        assert metric(b.url, "cacheon_fleet_load_plane_up") == 1
        for t in (thread, mine):
            t.join(30)
        assert routed and routed[0].status_code == 200


def test_a_lost_end_is_reconciled_and_bad_messages_are_counted(loop: LoopThread, nats_shared: Any,
                                                               plane_names: dict) -> None:
    """A peer's heartbeat lists what it still has in flight: an entry whose end was lost goes at the next one."""
    subject = f"cacheon.load.{plane_names['stream']}"

    async def run() -> tuple[int, int, int, float, tuple[int, float], tuple[int, float]]:
        share: LoadShare[Routed] = LoadShare(nats_shared.url, plane_names["stream"], 0.2, 5.0, CollectorRegistry(),
                                             lambda event, _routed: event)
        await share.start()
        peer = await nats.connect(nats_shared.url)
        try:
            while share.plane.value != "up":
                await asyncio.sleep(0.05)
            alone = share.staleness()
            send = msgspec.msgpack.encode
            routed = [Routed(n, "w0", [1, 2, 3], 4, 12, 12) for n in (1, 2)]
            late = time.time() - 0.5  # decided half a second ago: the delay's average moves by a fifth of it
            await peer.publish(f"{subject}.p", send(Batch("p", late, list(routed))))
            await peer.publish(f"{subject}.p", b"\x93not a batch")
            await peer.flush()
            await asyncio.sleep(0.3)
            both = len(share.flying("w0"))
            await peer.publish(f"{subject}.p", send(Batch("p", time.time(), [], live=[2])))  # the end of 1 was lost
            await peer.flush()
            await asyncio.sleep(0.3)
            left = [e.seq for e in share.flying("w0")]
            rejected = share.metrics.rejected._value.get()
            return both, len(left), left[0], rejected, alone, share.staleness()
        finally:
            await peer.close()
            await share.stop()

    both, left, seq, rejected, alone, stale = loop.call(run())
    assert (both, left, seq, rejected) == (2, 1, 2, 1.0)
    assert alone == (0, 0.0)  # no peer: nothing unseen to allow for
    assert stale[0] == 1 and 0.1 <= stale[1] < 0.15  # a heartbeat without events leaves the delay as it was


def test_a_peer_heard_again_after_expiry_is_asked_for_its_load(loop: LoopThread, nats_shared: Any,
                                                              plane_names: dict) -> None:
    """A peer that stalled past the expiry lost its entries here; its next batch (no hello: it never left)
    makes this replica say hello, so every peer publishes what it has in flight again."""
    subject = f"cacheon.load.{plane_names['stream']}"

    async def run() -> list[bool]:
        share: LoadShare[Routed] = LoadShare(nats_shared.url, plane_names["stream"], 0.1, 0.3, CollectorRegistry(),
                                             lambda event, _routed: event)
        peer = await nats.connect(nats_shared.url)
        hellos: list[bool] = []

        async def heard(msg: Any) -> None:
            hellos.append(msgspec.msgpack.decode(msg.data, type=Batch).hello)

        await peer.subscribe(f"{subject}.{share.replica}", cb=heard)
        await share.start()
        try:
            while not hellos:
                await asyncio.sleep(0.05)
            send = msgspec.msgpack.encode
            await peer.publish(f"{subject}.p", send(Batch("p", time.time(), [Routed(1, "w0", [1], 4, 4, 4)], hello=True)))
            await asyncio.sleep(0.8)  # past expiry: dropped as silent
            assert not share.flying("w0") and share.metrics.dropped.labels("silent")._value.get() == 1
            hellos.clear()
            await peer.publish(f"{subject}.p", send(Batch("p", time.time(), [], live=[1])))
            await asyncio.sleep(0.4)
            return hellos
        finally:
            await peer.close()
            await share.stop()

    assert True in loop.call(run())


def log_of(tmp_path: Path) -> str:
    """What ``serve_processes``' supervisor and its processes printed."""
    return (tmp_path / "gateway.log").read_text()


def serve_processes(stack: ExitStack, tmp_path: Path, profile: tuple[Path, Path], nats_url: str, stream: str,
                    ) -> tuple[subprocess.Popen[str], int, int, set[str]]:
    """``cacheon gateway serve --processes 2`` on one sim worker, once both processes answer on the port:
    the process, the traffic and admin ports, and the two replica ids (``host-pid-random``)."""
    sim = SimProcess(stack, tmp_path, profile, "0.5.23")
    sim.ready()
    port, admin = free_port(), free_range(2)  # process i's admin listener is on admin + i
    cfg = {"listen": f"127.0.0.1:{port}", "policy": "exact", "models": {"demo": gateway_model(*profile)},
           "workers": [{"url": sim.url}], "admin": {"listen": f"127.0.0.1:{admin}"}, "health_interval_s": 0.5,
           "event_plane": plane(nats_url, stream)}
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = stack.enter_context((tmp_path / "gateway.log").open("w"))  # a file: a pipe nobody reads fills and blocks
    proc = subprocess.Popen([sys.executable, "-m", "cacheon", "gateway", "serve", "--config", str(config),
                             "--processes", "2"], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    stack.callback(lambda: proc.poll() is None and proc.kill())
    replicas: set[str] = set()

    def both() -> bool:
        if proc.poll() is not None:
            raise ProcessError(f"the supervisor exited ({proc.returncode})")
        with httpx.Client(timeout=2) as fresh:  # a new connection each: the kernel spreads them
            replicas.add(fresh.get(f"http://127.0.0.1:{port}/readyz").json()["fleet_load"]["replica"])
        return len(replicas) == 2

    try:
        wait_until(both, "two processes answering on one port", 90)  # two interpreters starting on 2 busy cores
    except ProcessError as exc:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"{exc}; replicas seen {replicas}; its output:\n{log_of(tmp_path)}") from exc
    return proc, port, admin, replicas


def test_several_processes_serve_one_port(tmp_path: Path, profile: tuple[Path, Path], nats_shared: Any,
                                          plane_names: dict) -> None:
    """``--processes 2``: both bind the traffic port (SO_REUSEPORT) and answer on it, each its own replica
    hearing the other; SIGTERM to the parent stops both."""
    with ExitStack() as stack:
        proc, port, admin, _ = serve_processes(stack, tmp_path, profile, nats_shared.url, plane_names["stream"])
        for a in (admin, admin + 1):
            assert httpx.get(f"http://127.0.0.1:{a}/status", timeout=5).status_code == 200
        wait_until(lambda: shared(f"http://127.0.0.1:{port}")["peers"] == 1, "each to hear the other", 10)
        r = ask(f"http://127.0.0.1:{port}", "hello there")
        assert r is not None and r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        out = log_of(tmp_path)
        assert proc.returncode == 0, out
        assert out.count(f"on http://127.0.0.1:{port}") == 2 and "process 1 of 2" in out


def test_the_processes_die_with_their_supervisor(tmp_path: Path, profile: tuple[Path, Path], nats_shared: Any,
                                                 plane_names: dict) -> None:
    """The supervisor killed outright (no signal to forward): its processes stop rather than serve on, orphaned."""
    with ExitStack() as stack:
        proc, _, _, replicas = serve_processes(stack, tmp_path, profile, nats_shared.url, plane_names["stream"])
        pids = [int(r.split("-")[-2]) for r in replicas]
        proc.kill()
        proc.wait(10)

        def gone() -> bool:
            alive = []
            for pid in pids:
                try:
                    os.kill(pid, 0)
                    alive.append(pid)
                except ProcessLookupError:
                    pass
            return not alive

        try:
            wait_until(gone, "the orphaned processes to stop", 40)
        finally:
            for pid in pids:  # a failed run leaves none behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("given", "why"), [
    ({}, "needs event_plane with share_load"),
    ({"event_plane": {"url": "nats://127.0.0.1:1", "share_load": False}}, "needs event_plane with share_load"),
    ({"event_plane": {"url": "nats://127.0.0.1:1"}, "policy": "rr"}, "needs policy exact"),
    ({"event_plane": {"url": "nats://127.0.0.1:1"}, "listen": "127.0.0.1:0"}, "needs a fixed listen port"),
    ({"event_plane": {"url": "nats://127.0.0.1:1"}, "admin": {"listen": "127.0.0.1:65534"}}, "go past 65535"),
], ids=["no-plane", "share-off", "rr", "port-0", "admin-ports"])
def test_several_processes_need_shared_load(tmp_path: Path, profile: tuple[Path, Path], given: dict, why: str) -> None:
    """One line, exit 1, nothing served: several processes without shared load would each see a part."""
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"listen": "127.0.0.1:8080", "policy": "exact",
                                      "models": {"demo": gateway_model(*profile)}, **given}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "cacheon", "gateway", "serve", "--config", str(config),
                           "--processes", "3"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and why in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_expiry_not_past_the_heartbeat_is_refused(tmp_path: Path) -> None:
    """A live replica would expire between its own heartbeats: refused at load, naming both keys."""
    from cacheon.errors import UsageError
    from cacheon.gateway.config import parse

    plane_cfg = {"url": "nats://127.0.0.1:4222", "load_heartbeat_s": 2.0, "load_expiry_s": 2.0}
    with pytest.raises(UsageError, match=r"load_expiry_s .* must be longer than load_heartbeat_s"):
        parse({"policy": "rr", "event_plane": plane_cfg}, tmp_path, {})
    assert parse({"policy": "rr", "event_plane": {**plane_cfg, "load_expiry_s": 2.5}}, tmp_path, {}).event_plane
