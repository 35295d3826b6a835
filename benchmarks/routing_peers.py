"""Routing side by side: SGLang's own router and Cacheon's gateway over the same simulated workers and traces.

For each trace (``_traces``: chat, system, forks, burst) and each router, fresh simulated SGLang
workers (cold caches, page 4 by default) are started, the router goes in front of them, and the
trace is replayed through it in turn-synchronised waves with streamed requests. Routers:
``sglang:cache_aware`` and ``sglang:round_robin`` (PyPI ``sglang-router``, its own venv:
benchmarks/peers/install.sh; it routes by an approximate tree of request text), and Cacheon's
``rr``, ``approx`` (a tree of token prefixes it routed) and ``exact`` (the workers' KV events);
``exact:N`` is ``exact`` as N gateway processes on one port (``serve --processes N``, ``SO_REUSEPORT``),
replicas sharing their in-flight load over a real nats-server (``tests/fleet/natsd.py``), each
subscribed to every worker's KV events: the gateway on more than one core.

Per router and trace:
- hit rate: cached / prompt tokens, as the workers report them in each response's usage (the
  engine's own count, not the router's belief);
- TTFT p50 / p99: time to the first content chunk, measured by the client (the router's own request
  handling included: on this shared 2-core box a Python gateway's share is real);
- engine TTFT p50 / p99: what each request waited in its worker's queues plus its prefill and first
  decode step, in the simulator's own clock (``/sim/requests``): routing quality alone;
- max/mean load: requests served per worker (each worker's own counter, ``/sim/stats``), max over mean;
- throughput: requests per second over the replay's wall time;
- CPU per request: the router process's own CPU seconds (user + system, its children included, psutil)
  over the replay, divided by the requests sent: what routing and relaying one streamed request cost
  the router on the cores it shares with the workers and the client;
- beside it, per run: the rest of the box's CPU per request over the same replay (the simulated workers, all
  of them, and the client: this process), and how long the router's threads waited runnable for a core per
  unit of time they ran (``/proc/<pid>/task/<tid>/schedstat``): the share of two cores the router got.
Every router must send the same prompts (checked), so only placement differs. ``--runs N`` repeats
every (trace, router) pair N times, interleaved, and prints ranges (min-max over runs).

The simulated workers keep time as an engine does (``cacheon.sim.schedule``): a prefill takes
``--prefill-us-per-token`` for each prompt token not cached, one at a time per worker; each output
token takes ``--decode-ms-per-token``; at most ``--max-running-requests`` sequences run at once and
later arrivals queue in order. So TTFT is queue wait + uncached prefill + one decode step, and shows
both what routing kept cached and how it spread the load. ``--sim-arg`` passes further flags to
every ``cacheon sim worker``.

The verdict lines under each trace compare ``exact`` with ``sglang:cache_aware`` (issue 22's goals:
client TTFT p50 and p99 at or below the peer's, hit rate >= its - 0.01, request rate >= its, CPU per
request <= 2x its), the worst run of ``exact`` against the best of the peer.

``--router-nice N``: every thread of the router under test (either router, each process of its tree) at
nice N once it is up (negative: before the simulated workers and the client; root or CAP_SYS_NICE). Here the
router shares two cores with eight simulated engines and the client, where the scheduler shares a busy core
per thread: a one-loop Python gateway gets one share, a Rust router one per busy worker thread. In production
neither shares its cores with the engines; ``--router-nice -10`` is the nearest to that on this box, the
same for both routers (threads the router starts later inherit it).

Per request the client sends its own ``x-request-id``; for Cacheon's routers the run line then splits the
client's TTFT with the gateway's access log (``route_ms``, ``ttft_ms``): *route* (arrival to the routing
decision: decode, tokenize, choose), *upstream* (decision to the worker's first chunk: the worker's time,
and the gateway's loop reading it) and *outside* (the client's TTFT less the gateway's: reaching the
gateway's handler, and the relay back to the client), p50 each.

``--profile DIR``: py-spy samples every Cacheon gateway through its replays into
DIR/<trace>-<router>-<run>.txt; summarise with benchmarks/pyspy_top.py. By default ``--nonblocking``
(the gateway is never paused, so its figures stay near an unprofiled run; Python frames only: the
event loop's C time shows as ``Runner.run``); ``--profile-native`` adds the C frames (system calls,
the HTTP parser) at 100 Hz, pausing the gateway per sample.

    python benchmarks/routing_peers.py [--traces chat,system] [--routers sglang:cache_aware,exact] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fleet.natsd: the real nats-server

import httpx
import psutil
from _peers import ROOT, SglangRouter, failed
from _traces import TRACES, Message, Trace

from cacheon.sim.launch import GatewayProcess, SimProcess
from cacheon.sim.tokenizer import gateway_model, write_profile
from tests.fleet.natsd import NatsServer

ROUTERS = ("sglang:cache_aware", "sglang:round_robin", "rr", "approx", "exact")
VERSION = "0.5.13.post1"


@dataclass(frozen=True)
class Request:
    wave: int
    session: int
    prompt: str  # digest of the messages sent
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    latency_s: float
    worker: str | None  # the upstream Cacheon names (x-cacheon-worker); the peer names none
    request_id: str  # what the client sent as x-request-id
    route: str | None  # Cacheon's decision and its reason (x-cacheon-route)


@dataclass(frozen=True)
class Result:
    trace: str
    router: str
    hit_rate: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    engine_ttft_p50_ms: float
    engine_ttft_p99_ms: float
    load_max_mean: float
    load: list[int]
    requests_per_s: float
    requests: int
    routes: dict[str, int]  # Cacheon's decision reasons; empty for the peer
    probes: int  # requests the workers served beyond the trace's: Cacheon's (re-)attestation challenges
    cpu_ms_per_request: float  # the router process's CPU (user + system, children too) over the replay / requests
    split_p50_ms: dict[str, float]  # Cacheon's: the client's TTFT split by the gateway's access log; peer: empty
    box_ms_per_request: dict[str, float]  # the rest of the box over the replay / requests: workers (all), client
    core_wait: float  # the router's threads' time runnable but waiting for a core, per unit of time they ran


def pct(xs: Sequence[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stream(client: httpx.Client, url: str, model: str, messages: list[Message], max_tokens: int, request_id: str
           ) -> tuple[str, dict, float, float, httpx.Headers]:
    """One streamed chat completion: its text, usage, time to the first content chunk, total time, headers."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, usage, text = time.perf_counter(), None, None, []
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers={"x-request-id": request_id}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                if content := choice.get("delta", {}).get("content"):
                    first = first or time.perf_counter()
                    text.append(content)
    end = time.perf_counter()
    if usage is None or first is None:
        raise SystemExit(f"a streamed response from {url} had no usage or no content")
    return "".join(text), usage, first - start, end - start, r.headers


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its live children, theirs included."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live children so far."""
    return sum(t.user + t.system for t in (p.cpu_times() for p in tree(pid)))


def box_cpu_s(sims: list[SimProcess]) -> dict[str, float]:
    """CPU seconds so far of what shares the box with the router: the simulated workers, and the client (this
    process: its threads are the replay's, the rest of it idles meanwhile)."""
    own = psutil.Process().cpu_times()
    return {"workers": sum(cpu_s(sim.proc.pid) for sim in sims), "client": own.user + own.system}


def sched_s(pid: int) -> dict[int, tuple[float, float]]:
    """Per thread of ``pid`` (its children's too), the seconds it has run and waited runnable for a core (Linux
    schedstat): how the kernel shares the box's cores with the router, which its own CPU time does not show."""
    seen: dict[int, tuple[float, float]] = {}
    for proc in tree(pid):
        for thread in proc.threads():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                run_ns, wait_ns, _slices = Path(f"/proc/{proc.pid}/task/{thread.id}/schedstat").read_text().split()
                seen[thread.id] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return seen


def core_wait(before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]) -> float:
    """Time waited for a core per unit of time run between two ``sched_s`` readings, over the threads alive at
    the second (one started meanwhile counts whole; one that ended is not in it)."""
    ran = sum(run - before.get(tid, (0.0, 0.0))[0] for tid, (run, _) in after.items())
    waited = sum(wait - before.get(tid, (0.0, 0.0))[1] for tid, (_, wait) in after.items())
    return waited / ran if ran > 0 else 0.0


class Spy:
    """py-spy recording ``pid`` (collapsed stacks, native frames) until ``stop``."""

    def __init__(self, pid: int, out: Path, native: bool) -> None:
        spy = Path(os.environ.get("PY_SPY", Path(sys.executable).with_name("py-spy")))
        if not spy.exists():
            raise SystemExit(f"--profile needs py-spy ({spy}): .venv/bin/pip install py-spy")
        out.parent.mkdir(parents=True, exist_ok=True)
        self.out = out
        how = ["--native", "--rate", "100"] if native else ["--nonblocking", "--rate", "250"]
        self.proc = subprocess.Popen([str(spy), "record", "--pid", str(pid), "--format", "raw", *how,
                                      "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        time.sleep(1)  # attached before the replay starts

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes what it sampled on an interrupt
        _, err = self.proc.communicate(timeout=60)
        if not self.out.exists():
            raise SystemExit(f"py-spy wrote no profile: {err.strip()[-2000:]}")
        print(f"  profile: {self.out} (python benchmarks/pyspy_top.py {self.out})", flush=True)


def replay(url: str, model: str, trace: Trace, max_tokens: int) -> tuple[list[Request], float]:
    """The trace's waves through ``url``; every request, and the replay's wall time."""
    history: dict[int, list[Message]] = {}
    done: list[Request] = []
    widest = max(len(trace.active(w)) for w in range(trace.waves))
    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=widest)) as client, \
            ThreadPoolExecutor(widest) as pool:

        def send(wave: int, i: int) -> tuple[Request, list[Message]]:
            session = trace.sessions[i]
            turn = wave - session.start
            messages = list(session.opening) if turn == 0 else [
                *history[i], {"role": "user", "content": session.follow_ups[turn - 1]}]
            reply, usage, ttft, latency, headers = stream(client, url, model, messages, max_tokens, f"r{wave}-{i}")
            digest = hashlib.sha256(json.dumps(messages).encode()).hexdigest()[:16]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            return (Request(wave, i, digest, usage["prompt_tokens"], cached, ttft, latency,
                            headers.get("x-cacheon-worker"), f"r{wave}-{i}", headers.get("x-cacheon-route")),
                    [*messages, {"role": "assistant", "content": reply}])

        start = time.perf_counter()
        for wave in range(trace.waves):
            for request, messages in pool.map(lambda i, wave=wave: send(wave, i), trace.active(wave)):
                history[request.session] = messages
                done.append(request)
        return done, time.perf_counter() - start


def prioritize(pid: int, nice: int) -> None:
    """Every thread of ``pid``'s process tree at ``nice`` (Linux keeps a nice value per thread; later ones inherit)."""
    try:
        for proc in tree(pid):
            for thread in proc.threads():
                os.setpriority(os.PRIO_PROCESS, thread.id, nice)
    except PermissionError:
        raise SystemExit(f"--router-nice {nice}: raising a priority needs root or CAP_SYS_NICE") from None


_ACCESS = re.compile(r" cacheon\.access .*?request_id=(\S+).*? route_ms=([0-9.]+).*? ttft_ms=([0-9.]+)")


def split(log: Path, requests: list[Request]) -> dict[str, float]:
    """p50 of each part of the client's TTFT, joined per request by its id with the gateway's access lines
    (written every 0.2 s: waited for)."""
    wanted = {r.request_id: r.ttft_s * 1e3 for r in requests}
    deadline, lines = time.monotonic() + 5, {}
    while time.monotonic() < deadline:
        lines = {m[1]: (float(m[2]), float(m[3])) for m in _ACCESS.finditer(log.read_text()) if m[1] in wanted}
        if len(lines) == len(wanted):
            break
        time.sleep(0.2)
    else:
        failed(f"the gateway's log {log} has access lines for {len(lines)} of {len(wanted)} requests")
    parts = {"route": [route for route, _ in lines.values()],
             "upstream": [ttft - route for route, ttft in lines.values()],
             "outside": [wanted[rid] - ttft for rid, (_, ttft) in lines.items()]}
    return {name: pct(values, 0.5) for name, values in parts.items()}


def processes_of(router: str) -> int:
    """``exact:N``'s N: gateway processes on one port; 1 for every other router."""
    policy, _, n = router.partition(":")
    return int(n) if policy == "exact" and n.isdigit() else 1


def run_one(trace: Trace, router: str, args: argparse.Namespace, tmp: Path, profile: tuple[Path, Path],
            run: int) -> tuple[Result, list[Request]]:
    model = str(profile[0].parent)  # sglang-router loads the tokenizer from the model path: keep it local
    extra = ["--prefill-us-per-token", str(args.prefill_us_per_token), "--decode-ms-per-token",
             str(args.decode_ms_per_token), "--max-running-requests", str(args.max_running_requests), *args.sim_arg]
    releases = Path(os.environ.get("SGLANG_RELEASES_DIR", ROOT / ".sglang"))
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp, profile, VERSION, page_size=args.page, capacity_tokens=args.capacity_tokens,
                    delay_ms=args.delay_ms, model=model, releases=releases, extra_args=extra)
                for _ in range(args.workers)]
        for sim in sims:
            sim.ready()
        urls = [sim.url for sim in sims]
        if router.startswith("sglang:"):
            peer = SglangRouter(stack, tmp, urls, router.split(":", 1)[1], args.router_arg)
            url, pid, log = peer.url, peer.proc.pid, None
        else:
            policy, processes = router.partition(":")[0], processes_of(router)
            extra: dict[str, object] = {}
            if processes > 1:
                nats = stack.enter_context(NatsServer(tmp / f"nats-{trace.name}-{run}"))
                extra["event_plane"] = {"url": nats.url, "kv_events": "workers", "share_load": True}
            gw = GatewayProcess(stack, tmp, profile, policy, [{"url": u} for u in urls],
                                processes=processes, models={model: gateway_model(*profile)}, **extra)
            if policy == "exact":
                states = {u: w["ladder"] for u, w in gw.settled(urls).items()}
                fenced = {u: s["reason"] for u, s in states.items() if s["state"] != "READY"}
                if fenced:
                    raise SystemExit(f"exact: workers not attested, it would not route by prefix: {fenced}")
            url, pid, log = gw.url, gw.proc.pid, gw.log
        if args.router_nice:
            prioritize(pid, args.router_nice)
        before = [sim.stats()["completed"] for sim in sims]
        logged = [len(sim.requests()) for sim in sims]
        spy = None if args.profile is None or router.startswith("sglang:") else \
            Spy(pid, args.profile / f"{trace.name}-{router}-{run + 1}.txt", args.profile_native)
        cpu, box, sched = cpu_s(pid), box_cpu_s(sims), sched_s(pid)
        requests, wall = replay(url, model, trace, args.max_tokens)
        cpu, box = cpu_s(pid) - cpu, {k: v - box[k] for k, v in box_cpu_s(sims).items()}
        waits = core_wait(sched, sched_s(pid))
        if spy is not None:
            spy.stop()
        served = [sim.stats()["completed"] - b for sim, b in zip(sims, before, strict=True)]
        engine = [(r["queued_s"] + r["prefill_s"] + r["step_s"]) * 1e3
                  for sim, n in zip(sims, logged, strict=True) for r in sim.requests()[n:]]
        parts = split(log, requests) if log is not None else {}
    # The workers' own counters; Cacheon's gateway also sends its attestation probes (re-attestation
    # may run during a replay), so for it the response headers say which worker served each request,
    # and every worker must have served at least that many.
    load = served
    if not router.startswith("sglang:"):
        named = Counter(r.worker for r in requests)
        load = [named.get(u, 0) for u in urls]
        if sum(load) != len(requests) or any(h > c for h, c in zip(load, served, strict=True)):
            failed(f"{router} on {trace.name}: headers name {load}, the workers counted {served}")
    elif sum(load) != len(requests):
        failed(f"{router} on {trace.name}: workers served {sum(load)} requests for {len(requests)} sent")
    ttft = [r.ttft_s * 1e3 for r in requests]
    result = Result(trace.name, router, sum(r.cached_tokens for r in requests) / sum(r.prompt_tokens for r in requests),
                    pct(ttft, 0.5), pct(ttft, 0.99), pct(engine, 0.5), pct(engine, 0.99),
                    max(load) / statistics.mean(load), load, len(requests) / wall,
                    len(requests), dict(Counter(r.route for r in requests if r.route)), sum(served) - len(requests),
                    cpu * 1e3 / len(requests), parts, {k: v * 1e3 / len(requests) for k, v in box.items()},
                    waits)
    return result, requests


def span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"


def report(results: list[Result], routers: list[str], traces: list[str]) -> None:
    print(f"{'trace':<7} {'router':<19}{'hit rate':>13}{'TTFT p50 ms':>14}{'TTFT p99 ms':>14}"
          f"{'engine p50':>13}{'engine p99':>13}{'max/mean':>12}{'req/s':>10}{'CPU ms/req':>13}")
    for trace in traces:
        for router in routers:
            rs = [r for r in results if r.trace == trace and r.router == router]
            print(f"{trace:<7} {router:<19}{span([r.hit_rate for r in rs], '.3f'):>13}"
                  f"{span([r.ttft_p50_ms for r in rs], '.1f'):>14}{span([r.ttft_p99_ms for r in rs], '.1f'):>14}"
                  f"{span([r.engine_ttft_p50_ms for r in rs], '.1f'):>13}"
                  f"{span([r.engine_ttft_p99_ms for r in rs], '.1f'):>13}"
                  f"{span([r.load_max_mean for r in rs], '.2f'):>12}{span([r.requests_per_s for r in rs], '.0f'):>10}"
                  f"{span([r.cpu_ms_per_request for r in rs], '.2f'):>13}")
        goals(results, trace)


def goals(results: list[Result], trace: str) -> None:
    """Issue 22's goals for exact against cache_aware on this trace: the worst run of exact against the
    best of the peer, each with both sides' figures (ranges over runs)."""
    for router in dict.fromkeys(r.router for r in results if r.router == "exact" or processes_of(r.router) > 1):
        _goals([r for r in results if r.trace == trace and r.router == router],
               [r for r in results if r.trace == trace and r.router == "sglang:cache_aware"], router)


def _goals(exact: list[Result], peer: list[Result], router: str) -> None:
    if not exact or not peer:
        return

    def side(key: str, fmt: str) -> str:
        return f"{span([getattr(r, key) for r in exact], fmt)} vs {span([getattr(r, key) for r in peer], fmt)}"

    def at_most(key: str, factor: float = 1.0) -> bool:  # exact's worst run vs the peer's best
        return max(getattr(r, key) for r in exact) <= factor * min(getattr(r, key) for r in peer)

    def at_least(key: str, slack: float = 0.0) -> bool:
        return min(getattr(r, key) for r in exact) >= max(getattr(r, key) for r in peer) - slack

    checks = [("client TTFT p50 <=", "ttft_p50_ms", ".1f", at_most("ttft_p50_ms")),
              ("client TTFT p99 <=", "ttft_p99_ms", ".1f", at_most("ttft_p99_ms")),
              ("hit rate >= -0.01", "hit_rate", ".3f", at_least("hit_rate", 0.01)),
              ("req/s >=", "requests_per_s", ".0f", at_least("requests_per_s")),
              ("CPU/request <= 2x", "cpu_ms_per_request", ".2f", at_most("cpu_ms_per_request", 2.0))]
    cpu = statistics.mean(r.cpu_ms_per_request for r in exact) / statistics.mean(r.cpu_ms_per_request for r in peer)
    print(f"        {router} vs cache_aware: engine TTFT p50 {side('engine_ttft_p50_ms', '.1f')} ms, "
          f"p99 {side('engine_ttft_p99_ms', '.1f')} ms; CPU/request {cpu:.2f}x (means)")
    print("        goals: " + "; ".join(f"{name} {side(key, fmt)} {ok}" for name, key, fmt, ok in checks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--traces", default=",".join(TRACES), help="comma-separated: %(default)s")
    parser.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated: %(default)s")
    parser.add_argument("--runs", type=int, default=1, help="runs of every (trace, router), interleaved")
    parser.add_argument("--seed", type=int, default=0, help="the traces' seed")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--page", type=int, default=4, help="the workers' page size")
    parser.add_argument("--capacity-tokens", type=int, default=1 << 16, help="each worker's prefix-cache capacity")
    parser.add_argument("--prefill-us-per-token", type=float, default=50.0, help="simulated prefill, uncached tokens")
    parser.add_argument("--decode-ms-per-token", type=float, default=5.0, help="simulated decode, each sequence")
    parser.add_argument("--max-running-requests", type=int, default=4, help="sequences a worker runs at once")
    parser.add_argument("--delay-ms", type=int, default=0, help="a flat simulated time per request on top")
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--sim-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG to every `cacheon sim worker` (repeat; e.g. the time model's knobs)")
    parser.add_argument("--router-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG to every sglang-router (repeat; e.g. --router-arg=--balance-abs-threshold=8)")
    parser.add_argument("--router-nice", type=int, default=0, metavar="N",
                        help="every router thread at nice N (both routers alike; -10: ahead of the workers and client)")
    parser.add_argument("--json", action="store_true", help="print every run's result as JSON lines too")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="py-spy every Cacheon gateway's replays into DIR")
    parser.add_argument("--profile-native", action="store_true",
                        help="with C frames (py-spy then pauses the gateway per sample: TTFT and rate suffer)")
    args = parser.parse_args()
    traces, routers = args.traces.split(","), args.routers.split(",")
    unknown = sorted(set(traces) - set(TRACES)) + sorted(
        r for r in set(routers) if r not in ROUTERS and processes_of(r) == 1)
    if unknown or args.runs < 1 or args.workers < 1:
        raise SystemExit(f"unknown trace or router: {', '.join(unknown)}" if unknown else "need --runs, --workers >= 1")
    print(f"{args.workers} workers, page {args.page}, {args.capacity_tokens} cached tokens each; time model: "
          f"prefill {args.prefill_us_per_token:g} us per uncached token, decode {args.decode_ms_per_token:g} ms per "
          f"token, {args.max_running_requests or 'unbounded'} running per worker"
          + (f", +{args.delay_ms} ms flat" if args.delay_ms else "")
          + f"; {args.max_tokens} output tokens, seed {args.seed}, {args.runs} run(s); load = requests per worker; "
          + (f"routers at nice {args.router_nice}; " if args.router_nice else "")
          + f"load average {os.getloadavg()[0]:.1f}", flush=True)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="cacheon-routing-") as tmp:
        profile = write_profile(Path(tmp) / "tok")
        for name in traces:
            trace = TRACES[name](args.seed)
            prompts: list[str] | None = None
            for run in range(args.runs):
                for router in routers:
                    result, requests = run_one(trace, router, args, Path(tmp), profile, run)
                    sent = sorted(f"{r.wave}/{r.session}/{r.prompt}" for r in requests)
                    if prompts is not None and sent != prompts:
                        failed(f"{router} sent other prompts than the routers before it on {name}")
                    prompts = sent
                    results.append(result)
                    print(f"  {name} run {run + 1} {router}: hit {result.hit_rate:.3f}, "
                          f"client TTFT p50 {result.ttft_p50_ms:.1f} p99 {result.ttft_p99_ms:.1f} ms (engine "
                          f"{result.engine_ttft_p50_ms:.1f}, p99 {result.engine_ttft_p99_ms:.1f}), "
                          f"CPU {result.cpu_ms_per_request:.2f} ms/request, max/mean {result.load_max_mean:.2f}, "
                          f"{result.requests_per_s:.0f} req/s (load average {os.getloadavg()[0]:.1f}); box CPU "
                          f"ms/request: workers {result.box_ms_per_request['workers']:.2f}, client "
                          f"{result.box_ms_per_request['client']:.2f}; its threads waited {result.core_wait:.2f} ms "
                          "for a core per ms they ran"
                          + ("; client TTFT p50 split: " + ", ".join(
                              f"{k} {v:.1f}" for k, v in result.split_p50_ms.items()) + " ms"
                             if result.split_p50_ms else "")
                          + "".join(f"; {k} {v}" for k, v in sorted(result.routes.items()))
                          + (f"; {result.probes} attestation probe(s) during the replay: a worker was re-attested, "
                             "fenced meanwhile" if result.probes else ""), flush=True)
                    if args.json:
                        print(json.dumps(asdict(result)))
    report(results, routers, traces)


if __name__ == "__main__":
    main()
