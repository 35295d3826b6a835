"""``cacheon.aio.Outbox``: what a thread hands a loop arrives whole and in order, with one wake-up per burst."""

from __future__ import annotations

import asyncio
import threading

from cacheon.aio import Outbox


def test_a_threads_items_arrive_in_order_and_a_burst_wakes_the_loop_once() -> None:
    async def run() -> tuple[list[int], list[int]]:
        outbox: Outbox[int] = Outbox(asyncio.get_running_loop())
        wakes: list[int] = []
        ready_set = outbox._ready.set

        def counted() -> None:
            wakes.append(len(outbox))
            ready_set()

        outbox._ready.set = counted  # type: ignore[method-assign]
        burst = threading.Thread(target=lambda: [outbox.put(i) for i in range(1000)])
        burst.start()
        burst.join()
        got: list[int] = []
        while len(got) < 1000:
            got += await asyncio.wait_for(outbox.get(), 5)
        threading.Thread(target=outbox.put, args=(1000,)).start()  # an empty outbox wakes the loop again
        got += await asyncio.wait_for(outbox.get(), 5)
        return got, wakes

    got, wakes = asyncio.run(run())
    assert got == list(range(1001))
    assert len(wakes) == 2
