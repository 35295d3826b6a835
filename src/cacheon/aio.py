"""Event-loop hygiene shared by the loops Cacheon runs on threads of its own."""

from __future__ import annotations

import asyncio


async def cancel_pending(timeout_s: float = 2.0) -> None:
    """Cancel every task on the running loop but the caller's and wait (at most ``timeout_s``) for them
    to end, as ``asyncio.run`` does before it closes its loop. A task left pending is destroyed with the
    loop, and asyncio logs each one, later, into whatever stderr is then (another command's output)."""
    me = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not me]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=timeout_s)
