"""Event lag through the fleet event plane: publisher -> relay -> JetStream -> gateway index, p50/p99, beside
the gateway's direct ZMQ ingest of the same publisher in the same run; and each path's ingest rate.

One ZMQ PUB speaks the pin's wire (one BlockStored per page, ``PAGES`` pages per batch, the batch's
timestamp taken as it is sent). Two subscribers hear it: a relay (``fleet/relay.py``, publishing to a real
nats-server) followed by a gateway's plane consumer (``fleet/consumer.py``), and a direct ``Subscriber``
(the gateway's ingest without a plane). Lag = the time a batch is applied to the index - its timestamp.

1. Lag: batches at ``--rate`` block events/s for ``--seconds``; p50/p99 for both paths.
2. Ingest: ``--burst`` batches as fast as the PUB sends them; batches/s each path applied (direct) or
   published and applied (relay: acknowledged by the stream, then applied at the consumer).

    python benchmarks/fleet_lag.py [--rate 100000] [--seconds 3] [--burst 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fleet.natsd: the server the tests run

from cacheon.fleet.consumer import PlaneConsumer
from cacheon.fleet.relay import Followed, Relay, RelaySettings
from cacheon.kv.contracts import for_version
from cacheon.kv.feed import Delivery
from cacheon.kv.index import BlockIndex
from cacheon.kv.subscriber import Subscriber
from cacheon.kv.wire import WireBounds
from tests.fleet.natsd import NatsServer

PAGES, PAGE = 32, 16
CONTRACT = for_version("0.5.13.post1")


def payload(n: int) -> bytes:
    events, parent = [], None
    for i in range(PAGES):
        h = n * PAGES + i + 1
        events.append(["BlockStored", [h], parent, list(range(PAGE)), PAGE, None, None])
        parent = h
    return msgspec.msgpack.encode([time.time(), events, 0])


class Lags:
    def __init__(self) -> None:
        self.lags: list[float] = []
        self.last = 0.0

    def __call__(self, d: Delivery) -> None:
        if d.batch is not None:
            now = time.time()
            self.lags.append(now - d.batch.ts)
            self.last = now


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=100_000, help="block events/s in the lag phase")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--burst", type=int, default=5000, help="batches in the ingest phase")
    args = ap.parse_args()

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    with NatsServer(Path(tempfile.mkdtemp()) / "nats", max_bytes="2GB") as nats:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        found = Followed("bench", endpoint, None, CONTRACT, 1)

        async def resolve(_: str) -> Followed:
            return found

        settings = RelaySettings(url=nats.url, stream="BENCH", snapshot_bucket="bench-snap", snapshot_interval_s=3600)
        relay = Relay(settings, ["bench"], resolve)
        stop = asyncio.Event()
        asyncio.run_coroutine_threadsafe(relay.run(stop), loop)
        relayed, direct = Lags(), Lags()
        consumer = PlaneConsumer(nats.url, "BENCH", "bench-snap", 30.0)
        consumer.follow("bench", "w0", CONTRACT, 1, BlockIndex(), relayed, WireBounds())
        sub = Subscriber(BlockIndex(), direct)
        sub.add_worker("w0", endpoint, CONTRACT, [0])
        halt = threading.Event()
        threading.Thread(target=sub.run, args=(halt, 0.01), daemon=True).start()
        deadline = time.monotonic() + 15
        while not relay.follows and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the SUBs' slow joiner

        seq = 0

        def send(n: int, interval: float) -> None:
            nonlocal seq
            start = time.perf_counter()
            for i in range(n):
                if interval:
                    while time.perf_counter() < start + i * interval:
                        pass
                pub.send_multipart([b"", seq.to_bytes(8, "big"), payload(seq)])
                seq += 1

        def settle(expected: int, timeout: float = 60) -> None:
            end = time.monotonic() + timeout
            while (len(relayed.lags) < expected or len(direct.lags) < expected) and time.monotonic() < end:
                time.sleep(0.01)

        batches = int(args.rate * args.seconds / PAGES)
        send(batches, PAGES / args.rate)
        settle(batches)
        lag_relay, lag_direct = relayed.lags[:], direct.lags[:]
        print(f"lag phase: {batches} batches of {PAGES} pages at {args.rate:,.0f} block events/s")
        print(f"  direct ZMQ:  p50 {pct(lag_direct, 50) * 1e3:.2f} ms  p99 {pct(lag_direct, 99) * 1e3:.2f} ms "
              f"({len(lag_direct)} applied)")
        print(f"  via relay:   p50 {pct(lag_relay, 50) * 1e3:.2f} ms  p99 {pct(lag_relay, 99) * 1e3:.2f} ms "
              f"({len(lag_relay)} applied)")

        relayed.lags.clear()
        direct.lags.clear()
        start = time.time()
        send(args.burst, 0.0)
        settle(args.burst, 120)
        rd, rr = args.burst / (direct.last - start), args.burst / (relayed.last - start)
        print(f"ingest phase: {args.burst} batches as fast as sent")
        print(f"  direct ZMQ:  {rd:,.0f} batches/s = {rd * PAGES:,.0f} block events/s")
        print(f"  via relay:   {rr:,.0f} batches/s = {rr * PAGES:,.0f} block events/s  (relay / direct {rr / rd:.2f})")
        halt.set()
        asyncio.run_coroutine_threadsafe(_set(stop), loop).result(10)
        time.sleep(0.5)
        consumer.close()
        sub.close()
    pub.close(0)
    ctx.term()
    return 0


async def _set(event: asyncio.Event) -> None:
    event.set()


if __name__ == "__main__":
    sys.exit(main())
