"""What a router costs while no request comes: process CPU per second beside N quiet simulated workers.

A gateway follows each worker's KV events and health; with nothing to route, whatever CPU it spends is
fixed overhead that grows with the fleet, not with traffic. Per router (``exact``, ``rr``, ``sglang:*``
as in ``routing_peers.py``), fresh simulated workers, the router in front, settled (``exact``: every
worker attested), then the router process's CPU (user + system, psutil) over ``--seconds``, and its
threads' CPU (``/proc``, 10 ms ticks) split into the event loop's thread and the others (the KV feeds), with
how many threads it has and how many of the others spent a tick.

    python benchmarks/gateway_idle.py [--routers exact,sglang:cache_aware] [--workers 8] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from _peers import ROOT, SglangRouter
from routing_peers import VERSION, cpu_s

from cacheon.sim.launch import GatewayProcess, SimProcess
from cacheon.sim.tokenizer import gateway_model, write_profile

TICK_S = 0.01  # /proc's clock tick (USER_HZ 100)


def thread_ticks(pid: int) -> dict[int, int]:
    """utime + stime of each of ``pid``'s threads, in clock ticks."""
    ticks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


def measure(router: str, args: argparse.Namespace, tmp: Path) -> str:
    profile = write_profile(tmp / "tok")
    model = str(profile[0].parent)
    releases = Path(os.environ.get("SGLANG_RELEASES_DIR", ROOT / ".sglang"))
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp, profile, VERSION, page_size=4, model=model, releases=releases)
                for _ in range(args.workers)]
        for sim in sims:
            sim.ready()
        urls = [sim.url for sim in sims]
        if router.startswith("sglang:"):
            pid = SglangRouter(stack, tmp, urls, router.split(":", 1)[1], []).proc.pid
        else:
            gw = GatewayProcess(stack, tmp, profile, router, [{"url": u} for u in urls],
                                models={model: gateway_model(*profile)})
            if router == "exact":
                gw.settled(urls)
            pid = gw.proc.pid
        time.sleep(2)  # past start-up's own work
        cpu, threads, start = cpu_s(pid), thread_ticks(pid), time.monotonic()
        time.sleep(args.seconds)
        cpu, wall, after = cpu_s(pid) - cpu, time.monotonic() - start, thread_ticks(pid)
    spent = {tid: n - threads.get(tid, 0) for tid, n in after.items()}
    loop = spent.pop(pid, 0) * TICK_S * 1e3 / wall
    others = sum(spent.values()) * TICK_S * 1e3 / wall
    return (f"{router:<20}{cpu * 1e3 / wall:>10.1f}{loop:>12.1f}{others:>14.1f}{len(after):>10}"
            f"{len([n for n in spent.values() if n]):>14}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routers", default="exact,sglang:cache_aware", help="comma-separated: %(default)s")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured idle time per router")
    args = parser.parse_args()
    print(f"{args.workers} quiet simulated workers, {args.seconds:g} s each; load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    print(f"{'router':<20}{'CPU ms/s':>10}{'loop ms/s':>12}{'others ms/s':>14}{'threads':>10}{'busy others':>14}",
          flush=True)
    for router in args.routers.split(","):
        with tempfile.TemporaryDirectory(prefix="cacheon-idle-") as tmp:
            print(measure(router, args, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
