"""Wall-clock deadlines: a call's, an op's, a run's. The parent reads and writes the candidate's
channel under the earliest one, so a child that answers just under every per-call budget still
ends when its op's (or the run's) time is up."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    at: float  # time.monotonic() seconds
    what: str  # what passed, for the reason: "the op's 1800 s (--op-timeout)"

    @classmethod
    def after(cls, seconds: float, what: str) -> Deadline:
        return cls(time.monotonic() + seconds, what)

    def passed(self) -> bool:
        return time.monotonic() >= self.at


def earliest(first: Deadline, *others: Deadline | None) -> Deadline:
    return min((first, *(d for d in others if d is not None)), key=lambda d: d.at)
