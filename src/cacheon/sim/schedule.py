"""The simulated worker's time model: when a request starts, when its first token and its end come.

SGLang's shape, made plain, per DP rank: at most ``max_running`` sequences at a time, the rest
wait in arrival order; a sequence's prefill takes ``prefill_s_per_token`` for each prompt token
not already cached, one prefill at a time (prefill is compute-bound: two at once take as long as
both in turn); then the sequence decodes its output tokens one step apart, beside the others. So
time to first token is queue wait + uncached prefill + one step, and routing shows in it.

The scheduler is pure: it plans a request when it arrives, in the caller's clock. Planning in
arrival order is exact here because both queues are FIFO: every earlier arrival's prefill ends
before a later one's starts, so the cache a request matches at its prefill start is the cache
after every earlier plan (the caller matches and inserts at planning time, and publishes the
KV events at ``first_token - step``, when the simulated prefill ends).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class TimeModel:
    prefill_s_per_token: float = 0.0  # per uncached prompt token
    decode_s_per_token: float = 0.0  # per output token, each sequence
    max_running: int = 0  # concurrent sequences per rank; 0: no bound
    delay_s: float = 0.0  # a flat time per request on top, spread over its output tokens

    def __post_init__(self) -> None:
        if min(self.prefill_s_per_token, self.decode_s_per_token, self.max_running, self.delay_s) < 0:
            raise ValueError("time model values must be >= 0")

    def step_s(self, output_tokens: int) -> float:
        """The time between two output tokens of one sequence."""
        return self.decode_s_per_token + self.delay_s / max(output_tokens, 1)


@dataclass(frozen=True)
class Plan:
    """One request's schedule, in the scheduler's clock."""

    arrival: float
    prefill_start: float  # it has a slot and the prefill lane
    prefill_end: float  # its KV is cached (and published) from here
    step: float  # between output tokens
    tokens: int  # output tokens

    @property
    def queued(self) -> float:
        return self.prefill_start - self.arrival

    @property
    def first_token(self) -> float:
        return self.prefill_end + self.step

    @property
    def done(self) -> float:
        return self.prefill_end + self.tokens * self.step

    def token_at(self, k: int) -> float:
        """When output token ``k`` (from 0) is produced."""
        return self.prefill_end + (k + 1) * self.step


class RankScheduler:
    """One rank's running slots and prefill lane, planned in arrival order."""

    def __init__(self, model: TimeModel) -> None:
        self.model = model
        self._lane_free = float("-inf")  # when the prefill lane is next free
        self._running: list[float] = []  # heap: when each admitted sequence ends

    def plan(self, now: float, uncached_tokens: int, output_tokens: int) -> Plan:
        """Admit a request arriving at ``now`` with that much prefill work and output."""
        model, running = self.model, self._running
        while running and running[0] <= now:
            heapq.heappop(running)
        slot = now
        if model.max_running and len(running) >= model.max_running:
            slot = heapq.heappop(running)  # the earliest end frees the slot this request takes
        start = max(now, slot, self._lane_free)
        end = start + uncached_tokens * model.prefill_s_per_token
        self._lane_free = end
        plan = Plan(now, start, end, model.step_s(output_tokens), max(output_tokens, 1))
        heapq.heappush(running, plan.done)
        return plan
