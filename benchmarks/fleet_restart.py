"""How long a gateway replica restarted mid-run takes to agree with the others through the event plane (issue 25).

Each part is a process of its own, as deployed: a real nats-server; ``--workers`` simulated SGLang workers with
no replay endpoint, each sent a prompt of fresh token ids every ``1 / --rps`` seconds (one KV batch of stored
pages each time, and as many removed once the cache is full), sized for ``--rates`` stored block events/s over
the fleet; ``--relays`` relays (``cacheon kv relay``); three gateways (``cacheon gateway serve``) on the plane.

Mid-run, ``--restarts`` times per rate, one replica (each in turn) is killed (SIGKILL) and a new process started
with its config (new ports: nothing on the plane is tied to them). From the moment that process starts, and again
from when its HTTP server answers (seen within 0.1 s), the benchmark polls every replica's admin ``/status`` at
once every ``--poll`` s: its ``index_digest`` per worker, what ``cacheon_index_digest`` exports for the
disagreement alert. A worker agrees once the new replica's digest equals another replica's of that round or the
one before (under steady load a round often catches a replica between two batches: ``same`` says how often
the healthy ones match within one round); the replicas agree once every worker has. The replicas pass
through the same digests, so the first match is when the new one has replayed up to the live stream; the
poll's period bounds how late that is seen, and each round's digests (O(blocks) a worker, off the gateway's
loop) take some of the new replica's CPU. Also reported: the oldest worker snapshot's age as the process
started, and the stream messages on the workers' subjects after their snapshots then (what it replays).

    python benchmarks/fleet_restart.py [--rates 2000,20000] [--restarts 6] [--workers 4] [--relays 2]
        [--rps 10] [--snapshot-interval 10] [--poll 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fleet.natsd: the real nats-server

import httpx
import nats
import nats.js.errors
import yaml
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client.parser import text_string_to_metric_families

from cacheon.fleet import subjects
from cacheon.fleet.envelope import snapshot_decoder
from cacheon.sim.launch import GatewayProcess, SimProcess, spawn
from cacheon.sim.tokenizer import write_profile
from tests.fleet.natsd import NatsServer
from tests.gateway.agreement import digests

VERSION, PAGE = "0.5.13.post1", 4
STREAM, BUCKET = "CACHEON_KV", "cacheon-snapshots"
REPLICAS = 3
GOAL_S = 2.0
WAIT_S = 60.0  # a restarted replica that has not agreed by then is reported as never


class Restart(NamedTuple):
    rate: int
    replica: int
    snapshot_age_s: float  # the oldest of the workers' snapshots as the process started
    replayed: int  # stream messages on the workers' subjects after their snapshots, as the process started
    blocks: int  # blocks indexed over the workers (another replica's count) as the process started
    http_s: float  # process start -> its HTTP server answers
    follow_s: float | None  # process start -> it shows a digest for every worker (its snapshots loaded)
    agree_s: float | None  # process start -> every worker's digest equals another replica's (None: not in WAIT_S)


class Load:
    """Fresh prompts to each worker at a steady pace, on a thread of its own; ``tokens`` may change while it runs."""

    def __init__(self, urls: list[str], rps: float, tokens: int, seed: int = 0) -> None:
        self.urls, self.period, self.tokens = urls, 1.0 / rps, tokens
        self.sent = self.failed = self.late = 0
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._thread = threading.Thread(target=self._run, daemon=True, name="load")
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client, ThreadPoolExecutor(len(self.urls)) as pool:
            tick = time.monotonic()
            while not self._stop.is_set():
                ids = [[self._rng.randrange(1, 30000) for _ in range(self.tokens)] for _ in self.urls]
                for ok in pool.map(lambda a: self._send(client, *a), zip(self.urls, ids, strict=True)):
                    self.sent += 1
                    self.failed += not ok
                tick += self.period
                ahead = tick - time.monotonic()
                if ahead < 0:
                    self.late += 1
                    tick = time.monotonic()
                self._stop.wait(max(ahead, 0.0))

    @staticmethod
    def _send(client: httpx.Client, url: str, ids: list[int]) -> bool:
        try:
            r = client.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


async def _behind(url: str, workers: list[str]) -> tuple[float, int]:
    """The oldest worker snapshot's age (s) and the stream messages after each worker's snapshot, summed."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        store = await js.object_store(BUCKET)
        ages, pending = [], 0
        for worker in workers:
            try:
                info = await store.get_info(subjects.token(worker))
                seq = snapshot_decoder.decode((await store.get(subjects.token(worker))).data or b"").stream_seq
            except nats.js.errors.NotFoundError:  # no such object (or bucket) yet
                info, seq = None, 0  # the whole stream is replayed
            if info is not None and info.mtime:
                ages.append(time.time() - datetime.fromisoformat(info.mtime).timestamp())
            consumer = await js.add_consumer(STREAM, ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq + 1, ack_policy=AckPolicy.NONE,
                filter_subject=subjects.worker_filter(STREAM, worker), inactive_threshold=5.0))
            pending += int(consumer.num_pending or 0)
            await js.delete_consumer(STREAM, consumer.name)
        return (max(ages) if ages else float("nan")), pending
    finally:
        await nc.close()


async def _stream_last(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(STREAM)).state.last_seq)
    finally:
        await nc.close()


class Bench:
    """The deployment: workers, relays and the replicas, started once and kept for every rate."""

    def __init__(self, stack: ExitStack, tmp: Path, args: argparse.Namespace, nats_url: str) -> None:
        self.stack, self.tmp, self.args, self.nats_url = stack, tmp, args, nats_url
        self.profile = write_profile(tmp / "tok")
        sims = [SimProcess(stack, tmp, self.profile, VERSION, page_size=PAGE, capacity_tokens=args.capacity_tokens)
                for _ in range(args.workers)]
        for s in sims:
            s.ready()
        self.urls = [s.url for s in sims]
        self.specs = [{"id": f"w{i}", "url": u} for i, u in enumerate(self.urls)]
        plane = {"url": nats_url, "stream": STREAM, "snapshot_bucket": BUCKET}
        for r in range(args.relays):
            config = tmp / f"relay-{r}.yaml"
            config.write_text(yaml.safe_dump({"event_plane": plane, "workers": self.specs, "relay_id": f"relay-{r}",
                                              "snapshot_interval_s": args.snapshot_interval}))
            spawn(stack, ["kv", "relay", "--config", str(config)], tmp / f"relay-{r}.log")
        self.plane = plane
        self.gateways = [self.gateway() for _ in range(REPLICAS)]
        for gw in self.gateways:
            gw.settled(self.urls)
        self.pool = stack.enter_context(ThreadPoolExecutor(REPLICAS))

    def gateway(self) -> GatewayProcess:
        return GatewayProcess(self.stack, self.tmp, self.profile, "exact", self.specs, event_plane=self.plane)

    def round(self, gateways: list[GatewayProcess]) -> list[dict[str, str]]:
        """Every replica's digest per worker, read at once (one admin ``/status`` each); a worker with no digest (or
        no block) yet is left out, a replica that does not answer has none."""
        def one(gw: GatewayProcess) -> dict[str, str]:
            try:
                return {u: d for u, (d, blocks) in digests([gw], self.urls)[0].items() if d and blocks}
            except (httpx.HTTPError, KeyError):
                return {}
        return list(self.pool.map(one, gateways))

    def agreed(self, timeout: float) -> bool:
        """Whether every replica shows the same digest for every worker in some round within ``timeout``."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            seen = self.round(self.gateways)
            if all(len(s) == len(self.urls) for s in seen) and all(s == seen[0] for s in seen):
                return True
            time.sleep(self.args.poll)
        return False

    def same_round(self, rounds: int) -> float:
        """The share of ``rounds`` in which every replica showed the same digests: how often a round catches the
        replicas between the same two batches under this load (the precision of one round's comparison)."""
        hits = 0
        for _ in range(rounds):
            seen = self.round(self.gateways)
            hits += all(len(s) == len(self.urls) for s in seen) and all(s == seen[0] for s in seen)
            time.sleep(self.args.poll)
        return hits / rounds

    def restart(self, rate: int, i: int) -> Restart:
        others = [gw for j, gw in enumerate(self.gateways) if j != i]
        blocks = sum(w["indexed_blocks"] for w in others[0].status().values())
        self.gateways[i].proc.send_signal(signal.SIGKILL)
        self.gateways[i].proc.wait(10)
        age, replayed = asyncio.run(_behind(self.nats_url, [s["id"] for s in self.specs]))
        start = time.monotonic()
        gw = self.gateways[i] = self.gateway()  # returns once its HTTP server answers
        http = time.monotonic() - start
        followed: float | None = None
        matched: dict[str, float] = {}
        before: list[dict[str, str]] = []
        while len(matched) < len(self.urls) and time.monotonic() - start < WAIT_S:
            new, *rest = self.round([gw, *others])
            now = time.monotonic() - start
            if followed is None and len(new) == len(self.urls):
                followed = now
            for u, d in new.items():  # another replica's digest of this round or the one before (one may be behind)
                if u not in matched and any(r.get(u) == d for r in rest + before):
                    matched[u] = now
            before = rest
            time.sleep(self.args.poll)
        agree = max(matched.values()) if len(matched) == len(self.urls) else None
        if agree is None:
            self.explain(gw)
        return Restart(rate, i, age, replayed, blocks, http, followed, agree)


    @staticmethod
    def explain(gw: GatewayProcess) -> None:
        """What a replica that never agreed shows: each worker's ladder state and index, and its log's tail."""
        try:
            for url, w in gw.status().items():
                print(f"  {url}: {w['ladder']['state']} {w['ladder']['reason']} {w['ladder']['detail']}, "
                      f"{w['indexed_blocks']} blocks, digest {w['index_digest']}, subscribed {w['subscribed']}",
                      file=sys.stderr)
        except httpx.HTTPError as exc:
            print(f"  its status did not answer: {exc!r}", file=sys.stderr)
        print("".join(gw.log.read_text(errors="replace").splitlines(keepends=True)[-30:]), file=sys.stderr)


def tokens_for(rate: int, args: argparse.Namespace) -> int:
    """Prompt tokens per request for ``rate`` stored block events/s over the fleet (one page per block)."""
    return max(PAGE, round(rate / (args.workers * args.rps)) * PAGE)


def events_applied(gw: GatewayProcess) -> float:
    """KV events the replica applied so far, over every worker (``cacheon_kv_events``)."""
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) if family.name == "cacheon_kv_events"
               for sample in family.samples if sample.name == "cacheon_kv_events_total")


def throughput(bench: Bench, seconds: float) -> tuple[float, float]:
    """Block events/s one replica applies and stream messages/s, over ``seconds``."""
    events, seq = events_applied(bench.gateways[0]), asyncio.run(_stream_last(bench.nats_url))
    time.sleep(seconds)
    return ((events_applied(bench.gateways[0]) - events) / seconds,
            (asyncio.run(_stream_last(bench.nats_url)) - seq) / seconds)


class Phase(NamedTuple):
    rate: int
    events: float  # block events/s applied (stored and removed), one replica
    messages: float  # stream messages/s
    same_round: float
    restarts: list[Restart]


def summary(phase: Phase) -> str:
    def rng(xs: list[float], fmt: str) -> str:
        return f"{format(statistics.median(xs), fmt)} / {format(max(xs), fmt)}" if xs else "-"
    rows = phase.restarts
    timed = [(r.http_s, r.follow_s, r.agree_s) for r in rows if r.follow_s is not None and r.agree_s is not None]
    return (f"{phase.rate:>7,} {phase.events:>8,.0f} {phase.messages:>6.0f} {phase.same_round:>6.2f} "
            f"{rng([r.snapshot_age_s for r in rows], '.1f'):>11} {rng([float(r.replayed) for r in rows], '.0f'):>11} "
            f"{rng([r.http_s for r in rows], '.2f'):>12} {rng([f - h for h, f, _ in timed], '.2f'):>12} "
            f"{rng([a - h for h, _, a in timed], '.2f'):>12} {rng([a for *_, a in timed], '.2f'):>12} "
            f"{len(rows) - len(timed):>5}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="2000,20000", help="stored block events/s over the fleet, comma-separated")
    ap.add_argument("--restarts", type=int, default=6, help="restarts per rate")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--relays", type=int, default=2)
    ap.add_argument("--rps", type=float, default=10.0, help="requests per second to each worker")
    ap.add_argument("--capacity-tokens", type=int, default=1 << 16, help="each simulated worker's KV cache")
    ap.add_argument("--snapshot-interval", type=float, default=10.0, help="the relays' snapshot_interval_s")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds of load at each rate before its restarts")
    ap.add_argument("--poll", type=float, default=0.1, help="seconds between digest rounds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    rng = random.Random(args.seed)
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        nats_server = stack.enter_context(NatsServer(Path(tmp) / "nats", max_bytes="2GB"))
        bench = Bench(stack, Path(tmp), args, nats_server.url)
        load = Load(bench.urls, args.rps, tokens_for(rates[0], args), args.seed)
        stack.callback(load.stop)
        for rate in rates:
            load.tokens = tokens_for(rate, args)
            time.sleep(args.warmup)
            if not bench.agreed(30):
                raise SystemExit(f"rate {rate}: the replicas did not agree in one round within 30 s")
            events, messages = throughput(bench, 2.0)
            phase = Phase(rate, events, messages, bench.same_round(20), [])
            for n in range(args.restarts):
                time.sleep(rng.uniform(1.0, args.snapshot_interval))  # a spread of snapshot ages
                row = bench.restart(rate, n % REPLICAS)
                phase.restarts.append(row)
                agree = "never" if row.agree_s is None else f"{row.agree_s:.2f} s"
                follow = "never" if row.follow_s is None else f"{row.follow_s:.2f} s"
                print(f"rate {rate:,}: replica {row.replica} restarted: snapshot {row.snapshot_age_s:.1f} s old, "
                      f"{row.replayed:,} messages after it, {row.blocks:,} blocks indexed; HTTP in {row.http_s:.2f} s, "
                      f"every worker followed in {follow}, agreed in {agree}", flush=True)
            phases.append(phase)
        print(f"\nload: {load.sent:,} requests, {load.failed} failed, {load.late} ticks late")
    print(f"\n{args.workers} workers (page {PAGE}, {args.capacity_tokens:,}-token caches, {args.rps:g} requests/s "
          f"each, no replay endpoint), {args.relays} relays (snapshot every {args.snapshot_interval:g} s), {REPLICAS} "
          f"gateway replicas; digests polled every {args.poll:g} s. Times in s, p50 / max over restarts; events/s: "
          f"block events applied by one replica; same: the share of rounds all replicas agreed before the restarts")
    print(f"{'rate':>7} {'events/s':>8} {'msgs/s':>6} {'same':>6} {'snap age':>11} {'replayed':>11} "
          f"{'start->HTTP':>12} {'HTTP->follow':>12} {'HTTP->agree':>12} {'start->agree':>12} {'never':>5}")
    for phase in phases:
        print(summary(phase))
    rows = [r for phase in phases for r in phase.restarts]
    worst = max((r.agree_s for r in rows if r.agree_s is not None), default=None)
    never = sum(r.agree_s is None for r in rows)
    met = not never and worst is not None and worst <= GOAL_S
    print(f"\nverdict: goal (a restarted replica agrees within {GOAL_S:g} s) {'MET' if met else 'MISSED'}: "
          f"worst {worst if worst is None else round(worst, 2)} s from the process's start over {len(rows)} restarts"
          + (f", {never} never agreed within {WAIT_S:g} s" if never else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
