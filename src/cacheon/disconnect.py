"""Server side: stop work for a client that has gone (the gateway's upstream calls, the simulator's generation).

SGLang aborts a request whose client disconnects; the gateway must do the same to its upstream
call so the worker learns of it, and the simulator behaves as SGLang does. Starlette does not
cancel a non-streaming handler when its client leaves, so the handler races its work against
the disconnect itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


async def _gone(request: Request) -> None:
    """Returns when the client disconnects (the body is read already, so nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """``(True, result)`` of ``work``, or ``(False, None)`` with ``work`` cancelled if the client left first.

    Exceptions from ``work`` propagate; when both end together, the finished work wins.
    """
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_gone(request))
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if not task.done():
        task.cancel()
        return False, None
    return True, task.result()
