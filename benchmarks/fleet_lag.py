"""Event lag through the fleet event plane: publisher -> relay -> JetStream -> gateway index, p50/p99, beside
the gateway's direct ZMQ ingest of the same publisher in the same run; and each path's ingest rate.

Each part runs in a process of its own, as it would be deployed: this one is the ZMQ PUB (the pin's wire, one
BlockStored per page, ``PAGES`` pages per batch, the batch's timestamp taken as it is sent); a real nats-server;
a relay (``fleet/relay.py``: the code ``cacheon kv relay`` runs, without its HTTP discovery of the worker);
a gateway's plane consumer (``fleet/consumer.py``); and a direct ``Subscriber`` (the gateway's ingest without a
plane). Lag = the wall-clock time a batch is applied to an index - its timestamp (one host, one clock). The
relay's own figure is taken as the stream acknowledges a batch (its replica applies it then).

Each phase runs (a) with every process running, then (b) with each path alone: the other path's processes
stopped (SIGSTOP) meanwhile and let catch up after, so a path's figure is not the other's CPU on a small box;
the ingest also (c) with the relay alone, its consumer stopped too (the nats-server's cost of one consumer).

1. Lag: batches at each of ``--rates`` block events/s for ``--seconds``; p50/p99.
2. Ingest: ``--burst`` batches (encoded beforehand) as fast as the PUB sends them; block events/s each part
   applied, and each process's CPU (user + system) per block event.

    python benchmarks/fleet_lag.py [--rates 20000,100000] [--seconds 3] [--burst 5000] [--profile DIR]

``--profile DIR`` records py-spy (``--format raw``, for ``benchmarks/pyspy_top.py``) of each path's processes
during its ingest alone (``DIR/<path>-<role>.txt``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec
import psutil
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fleet.natsd: the server the tests run

from cacheon.fleet.consumer import PlaneConsumer
from cacheon.fleet.relay import Followed, Relay, RelaySettings
from cacheon.gateway.heap import freeze_startup_objects
from cacheon.kv.contracts import for_version
from cacheon.kv.feed import Delivery
from cacheon.kv.index import BlockIndex
from cacheon.kv.subscriber import Subscriber
from cacheon.kv.wire import WireBounds
from tests.fleet.natsd import NatsServer

PAGES, PAGE = 32, 16
CONTRACT = for_version("0.5.13.post1")
STREAM, BUCKET, WORKER = "BENCH", "bench-snap", "bench"
ROLES = ("direct", "relay", "plane")  # plane: the gateway's consumer, downstream of the relay
PATHS = {"direct": ("direct",), "relay": ("relay", "plane"), "publish": ("relay",)}  # publish: no consumer


def payload(n: int) -> bytes:
    events, parent = [], None
    for i in range(PAGES):
        h = n * PAGES + i + 1
        events.append(["BlockStored", [h], parent, list(range(PAGE)), PAGE, None, None])
        parent = h
    return msgspec.msgpack.encode([time.time(), events, 0])


class Lags:
    """Each applied batch's lag, appended by the ingest's thread, taken by the process's command loop."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.last = 0.0

    def __call__(self, d: Delivery) -> None:
        if d.batch is not None:
            now = time.time()
            self.lags.append(now - d.batch.ts)
            self.last = now

    def take(self) -> tuple[list[float], float]:
        lags, self.lags = self.lags, []
        return lags, self.last


def start_direct(endpoint: str, _: str, lags: Lags) -> Callable[[], None]:
    sub = Subscriber(BlockIndex(), lags)
    sub.add_worker("w0", endpoint, CONTRACT, [0])
    thread = threading.Thread(target=sub.run, daemon=True)
    thread.start()

    def close() -> None:
        sub.stop()
        thread.join(5)
        sub.close()
    return close


def start_plane(_: str, url: str, lags: Lags) -> Callable[[], None]:
    consumer = PlaneConsumer(url, STREAM, BUCKET, 30.0)
    feed = consumer.follow(WORKER, "w0", CONTRACT, 1, BlockIndex(), lags, WireBounds())
    while not feed.subscribed:
        time.sleep(0.05)
    return consumer.close


def start_relay(endpoint: str, url: str, lags: Lags) -> Callable[[], None]:
    """The relay, its leases long enough to outlast a SIGSTOP; ``lags`` hears its replica (what was acknowledged)."""
    found = Followed(WORKER, endpoint, None, CONTRACT, 1)

    async def resolve(_: str) -> Followed:
        return found

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    settings = RelaySettings(url=url, stream=STREAM, snapshot_bucket=BUCKET, snapshot_interval_s=3600, lease_s=600)
    relay = Relay(settings, [WORKER], resolve)
    stop = asyncio.Event()
    done = asyncio.run_coroutine_threadsafe(relay.run(stop), loop)
    while WORKER not in relay.follows:
        time.sleep(0.05)
    relay.follows[WORKER].replica.on_delivery = lags

    def close() -> None:
        loop.call_soon_threadsafe(stop.set)
        done.result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    return close


STARTS = {"direct": start_direct, "relay": start_relay, "plane": start_plane}


def serve(role: str, endpoint: str, url: str, conn: Connection) -> None:
    """A child process: one part, answering ``count``, ``take`` and ``stop`` from the publisher."""
    lags = Lags()
    close = STARTS[role](endpoint, url, lags)
    # As deployed: `gateway serve` and `kv relay` freeze their start-up heap, a relay with CPython's thresholds.
    if role == "relay":
        freeze_startup_objects(thresholds=None)
    else:
        freeze_startup_objects()
    conn.send("ready")
    while (cmd := conn.recv()) != "stop":
        conn.send(len(lags.lags) if cmd == "count" else lags.take())
    close()
    conn.send(None)


class Part:
    def __init__(self, ctx: multiprocessing.context.SpawnContext, role: str, endpoint: str, url: str) -> None:
        self.role = role
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(role, endpoint, url, child), name=role, daemon=True)
        self.process.start()
        assert self.process.pid is not None
        self.ps = psutil.Process(self.process.pid)

    def ask(self, cmd: str) -> object:
        self.conn.send(cmd)
        return self.conn.recv()

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else float("nan")


class Bench:
    def __init__(self, pub: zmq.Socket[bytes], parts: dict[str, Part], nats: psutil.Process) -> None:
        self.pub, self.parts, self.nats = pub, parts, nats
        self.seq = 0

    def send(self, payloads: list[bytes] | int, interval: float = 0.0) -> None:
        """Pre-encoded payloads as fast as the socket takes them, or ``n`` fresh ones (timestamped as sent) paced
        ``interval`` apart (sleeping, so the PUB takes no core the others need)."""
        start = time.perf_counter()
        n = payloads if isinstance(payloads, int) else len(payloads)
        for i in range(n):
            if interval and (ahead := start + i * interval - time.perf_counter()) > 0:
                time.sleep(ahead)
            data = payload(self.seq) if isinstance(payloads, int) else payloads[i]
            self.pub.send_multipart([b"", self.seq.to_bytes(8, "big"), data])
            self.seq += 1

    def settle(self, expected: int, roles: tuple[str, ...] = ROLES, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(self.parts[r].ask("count") >= expected for r in roles):  # type: ignore[operator]
                return
            time.sleep(0.02)
        raise SystemExit(f"not all applied {expected} batches in {timeout:g}s: "
                         + ", ".join(f"{r} {self.parts[r].ask('count')}" for r in roles))

    def take(self) -> dict[str, tuple[list[float], float]]:
        return {r: p.ask("take") for r, p in self.parts.items()}  # type: ignore[misc]

    def cpu(self) -> dict[str, float]:
        t = self.nats.cpu_times()
        return {**{r: p.cpu() for r, p in self.parts.items()}, "nats": t.user + t.system,
                "pub": time.process_time()}

    def warm_up(self) -> None:
        """A batch every 50 ms until every part has applied one (the SUBs' slow joiner, the relay's first epoch)."""
        end = time.monotonic() + 30
        while not all(p.ask("count") for p in self.parts.values()):
            if time.monotonic() > end:
                raise SystemExit("parts not ready in 30 s")
            self.send(1)
            time.sleep(0.05)
        time.sleep(0.2)
        self.take()

    @contextlib.contextmanager
    def only(self, path: str | None) -> Iterator[tuple[str, ...]]:
        """Run the phase with ``path``'s processes alone (None: every process): the others are stopped (SIGSTOP)
        meanwhile, then let catch up and their batches dropped. Yields the roles measured."""
        measured = tuple(r for r in ROLES if path is None or r in PATHS[path])
        stopped = tuple(r for r in ROLES if r not in measured)
        first = self.seq
        for r in stopped:
            self.parts[r].ps.send_signal(signal.SIGSTOP)
        try:
            yield measured
        finally:
            for r in stopped:
                self.parts[r].ps.send_signal(signal.SIGCONT)
        if stopped:
            self.settle(self.seq - first, stopped)
            for r in stopped:
                self.parts[r].ask("take")

    def lag(self, rate: float, seconds: float, path: str | None) -> None:
        batches = int(rate * seconds / PAGES)
        with self.only(path) as measured:
            self.send(batches, PAGES / rate)
            self.settle(batches, measured)
            got = {r: self.parts[r].ask("take") for r in measured}
        print(f"lag ({'every process' if path is None else path + ' path alone'}): {batches} batches of {PAGES} "
              f"pages at {rate:,.0f} block events/s")
        for role, (lags, _) in got.items():  # type: ignore[misc]
            print(f"  {role:<7} p50 {pct(lags, 50) * 1e3:7.2f} ms  p99 {pct(lags, 99) * 1e3:7.2f} ms  "
                  f"max {max(lags) * 1e3:7.2f} ms  ({len(lags)} applied)")

    def ingest(self, burst: int, path: str | None, profile: Path | None) -> dict[str, float]:
        """``burst`` batches (encoded beforehand) as fast as sent; block events/s and CPU per event each role."""
        payloads = [payload(self.seq + i) for i in range(burst)]
        with self.only(path) as measured:
            spies = [spy(self.parts[r], profile / f"{path}-{r}.txt") for r in measured] if profile else []
            cpu0 = self.cpu()
            start = time.time()
            self.send(payloads)
            self.settle(burst, measured)
            cpu1 = self.cpu()
            for s in spies:
                s.send_signal(signal.SIGINT)
                s.wait(30)
            got = {r: self.parts[r].ask("take") for r in measured}
        rates = {r: burst * PAGES / (last - start) for r, (_, last) in got.items()}  # type: ignore[misc]
        events = burst * PAGES
        print(f"ingest ({'every process' if path is None else path + ' path alone'}): {burst} batches as fast as sent")
        for r, v in rates.items():
            print(f"  {r:<7} {v:10,.0f} block events/s  CPU {(cpu1[r] - cpu0[r]) / events * 1e6:5.2f} us/event")
        print(f"  nats-server CPU {(cpu1['nats'] - cpu0['nats']) / events * 1e6:5.2f} us/event, "
              f"publisher {(cpu1['pub'] - cpu0['pub']) / events * 1e6:5.2f} us/event")
        return rates


def spy(part: Part, out: Path) -> subprocess.Popen[bytes]:
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(["py-spy", "record", "-r", "500", "--format", "raw", "-o", str(out), "--pid",
                             str(part.process.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="20000,100000", help="block events/s in the lag phases, comma-separated")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--burst", type=int, default=5000, help="batches in each ingest phase")
    ap.add_argument("--profile", type=Path, help="py-spy raw profiles of each path's ingest alone, into DIR")
    args = ap.parse_args()

    zctx = zmq.Context()
    pub = zctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    endpoint = f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}"
    ctx = multiprocessing.get_context("spawn")
    with NatsServer(Path(tempfile.mkdtemp()) / "nats", max_bytes="4GB") as nats:
        assert nats._process is not None
        parts = {r: Part(ctx, r, endpoint, nats.url) for r in ROLES}
        for p in parts.values():
            if p.conn.recv() != "ready":
                raise SystemExit(f"{p.role} did not start")
        bench = Bench(pub, parts, psutil.Process(nats._process.pid))
        bench.warm_up()
        for rate in (float(r) for r in args.rates.split(",")):
            for path in (None, "direct", "relay"):
                bench.lag(rate, args.seconds, path)
        rates = {path: bench.ingest(args.burst, path, None if path is None else args.profile)
                 for path in (None, *PATHS)}
        for name, direct, relay in (("every process", rates[None], rates[None]),
                                    ("each path alone", rates["direct"], rates["relay"])):
            print(f"relay / direct ({name}): acknowledged {relay['relay'] / direct['direct']:.2f}, "
                  f"applied at the plane consumer {relay['plane'] / direct['direct']:.2f}")
        print(f"relay / direct (each alone, the relay with no consumer): "
              f"{rates['publish']['relay'] / rates['direct']['direct']:.2f}")
        for p in parts.values():
            p.ask("stop")
            p.process.join(10)
    pub.close(0)
    zctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
