"""The simulator's time model: in simulated time (the pure scheduler), then the worker publishing on it.

Nothing here measures a duration: plans are exact in the scheduler's clock, and the worker tests
only rely on the event loop running timers in time order.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from cacheon.sim.schedule import RankScheduler, TimeModel
from cacheon.sim.worker import SimSettings, SimWorker

P, D = 1e-4, 2e-3  # 100 us a prefill token, 2 ms a decode step


def test_time_to_first_token_follows_the_uncached_tokens() -> None:
    sched = RankScheduler(TimeModel(P, D))
    cold = sched.plan(0.0, uncached_tokens=1000, output_tokens=4)
    assert (cold.queued, cold.prefill_end, cold.first_token) == (0.0, pytest.approx(0.1), pytest.approx(0.102))
    warm = sched.plan(10.0, uncached_tokens=100, output_tokens=4)  # the same prompt, 900 tokens cached
    assert warm.first_token - warm.arrival == pytest.approx(100 * P + D)
    assert warm.done - warm.arrival == pytest.approx(0.01 + 4 * D)


def test_prefills_queue_one_at_a_time_and_decodes_run_beside_each_other() -> None:
    sched = RankScheduler(TimeModel(P, D))
    a, b, c = (sched.plan(0.0, 1000, 8) for _ in range(3))
    assert [p.prefill_start for p in (a, b, c)] == pytest.approx([0.0, 0.1, 0.2])  # prefill is compute-bound
    assert b.queued == pytest.approx(0.1) and c.first_token == pytest.approx(0.3 + D)
    assert a.done == pytest.approx(0.1 + 8 * D) and a.done < c.prefill_start  # a decodes while c waits to prefill


def test_a_bounded_rank_queues_arrivals_in_order_until_a_sequence_ends() -> None:
    sched = RankScheduler(TimeModel(P, D, max_running=2))
    a = sched.plan(0.0, 0, 10)  # fully cached: no prefill work, 20 ms of decode
    b = sched.plan(0.0, 0, 5)  # 10 ms
    c = sched.plan(0.001, 0, 1)  # both slots taken: waits for the first to end (b, at 10 ms)
    d = sched.plan(0.002, 0, 1)  # then for the next (c, at 12 ms)
    assert (a.queued, b.queued) == (0.0, 0.0)
    assert c.prefill_start == pytest.approx(b.done) == pytest.approx(0.010)
    assert d.prefill_start == pytest.approx(c.done) == pytest.approx(0.012)
    assert sched.plan(1.0, 0, 1).queued == 0.0  # long after: every slot is free again


def test_the_flat_delay_alone_is_the_old_model() -> None:
    plan = RankScheduler(TimeModel(delay_s=0.2)).plan(5.0, 3000, 4)
    assert plan.done - plan.arrival == pytest.approx(0.2)
    assert [plan.token_at(k) - 5.0 for k in range(4)] == pytest.approx([0.05, 0.1, 0.15, 0.2])
    with pytest.raises(ValueError):
        TimeModel(prefill_s_per_token=-1)


class Recorder:
    """Stands in for the release publishers: what was published, and when (loop time)."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, int, list[int], list[int]]] = []

    def publish(self, rank: int, stored: list, removed: list[int], block_size: int) -> None:
        self.sent.append((asyncio.get_running_loop().time(), rank, [p.block_hash for p in stored], removed))


def _worker(model: TimeModel, dp_size: int = 1) -> tuple[SimWorker, Recorder]:
    recorder = Recorder()
    settings = SimSettings("m", "0.5.13.post1", page_size=4, dp_size=dp_size, kv_port=1, capacity_tokens=1 << 14,
                           time=model)
    return SimWorker(settings, profile=None, publishers=recorder), recorder  # type: ignore[arg-type]


def test_kv_events_go_out_when_the_simulated_prefill_ends_in_order() -> None:
    async def run() -> None:
        sim, recorder = _worker(TimeModel(prefill_s_per_token=2e-4))
        tokens = list(range(400))  # 100 pages: 80 ms of prefill
        cached, first = sim.admit(tokens, 4, len(tokens), 0)
        assert cached == 0 and recorder.sent == []  # the prefill has not run yet
        cached, second = sim.admit(tokens + list(range(1000, 1040)), 4, 440, 0)  # shares 400 tokens, queues behind it
        assert cached == 400 and second.prefill_start == pytest.approx(first.prefill_end)
        await asyncio.sleep(second.prefill_end - asyncio.get_running_loop().time() + 0.01)
        (t1, _, stored1, _), (t2, _, stored2, _) = recorder.sent
        # never before the simulated prefill ends (asyncio runs a timer up to its clock's resolution early)
        early = time.get_clock_info("monotonic").resolution
        assert t1 >= first.prefill_end - early and t2 >= second.prefill_end - early
        assert len(stored1) == 100 and len(stored2) == 10
        assert sim.stats["prompt_tokens"] == 840 and sim.stats["cached_tokens"] == 400
        assert sim.stats["prefill_s"] == pytest.approx(440 * 2e-4)

    asyncio.run(run())


def test_a_rank_with_a_short_prefill_does_not_publish_another_ranks_early() -> None:
    async def run() -> None:
        sim, recorder = _worker(TimeModel(prefill_s_per_token=2e-4), dp_size=2)
        long = sim.admit(list(range(800)), 1, 800, 0)[1]  # rank 0: 160 ms
        short = sim.admit(list(range(5000, 5008)), 1, 8, 1)[1]  # rank 1: 1.6 ms
        await asyncio.sleep(short.prefill_end - asyncio.get_running_loop().time() + 0.01)
        assert [rank for _, rank, _, _ in recorder.sent] == [1]
        await asyncio.sleep(long.prefill_end - asyncio.get_running_loop().time() + 0.01)
        assert [rank for _, rank, _, _ in recorder.sent] == [1, 0]

    asyncio.run(run())


def test_the_worker_imports_anyios_backend_at_start_up_not_in_its_first_stream() -> None:
    """Starlette streams in an anyio task group, and anyio imports its asyncio backend at the first one: 17-25 ms
    of CPU that landed in a benchmark's first streamed request per worker. The app's start-up does it instead
    (a fresh interpreter: this one has long imported it)."""
    code = """
import asyncio, sys
from cacheon.sim.worker import SimSettings, SimWorker, build_app
settings = SimSettings("m", "0.5.13.post1", page_size=4, dp_size=1, kv_port=1, capacity_tokens=1 << 14)
app = build_app(SimWorker(settings, profile=None, publishers=None))
before = "anyio._backends._asyncio" in sys.modules
async def start() -> bool:
    async with app.router.lifespan_context(app):
        return "anyio._backends._asyncio" in sys.modules
print(before, asyncio.run(start()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True"], out.stderr
