"""All-or-nothing arming across ranks.

Mixed implementations across tensor-parallel ranks are worse than either one: a collective whose ranks
run different code deadlocks or silently reduces garbage, and an op that differs by rank breaks the
replicated state. So whenever a process group with more than one rank is created in an armed (or
refused) process, every rank states its claim (the bundle digest it armed, or why it could not), and
every rank completes one call of the bundle's collective through the harness-owned group. If any rank
cannot, every rank aborts. Version-independent: the adapter decides where groups are created.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cacheon.runtime.boundary import SeamViolation, call_entry


class CollectiveAbort(RuntimeError):
    """Raised on every rank when any rank did not arm the same bundle or could not complete the call."""


@dataclass(frozen=True)
class GroupView:
    """The parts of an engine's process-group object the protocol needs."""

    agreement: Any  # a CPU (gloo) group for the claims; never handed to bundle code
    bundle_group: Any  # the harness-owned group a collective entry receives
    device: torch.device
    world_size: int


Probe = Callable[[GroupView], None]


@dataclass(frozen=True)
class Claim:
    """What this rank armed: a digest, or the reason it could not; plus its collective probe, if any."""

    digest: str | None
    error: str | None = None
    probe: Probe | None = None


def enforce(claim: Claim, view: GroupView) -> None:
    """Agree with every rank of ``view`` or raise :class:`CollectiveAbort` on all of them."""
    if view.world_size == 1:
        if claim.error:
            raise CollectiveAbort(f"this rank could not arm: {claim.error}")
        return
    _agree(view, {"digest": claim.digest, "error": claim.error}, "arm")
    if claim.probe is not None:  # same digest everywhere now, so every rank takes this branch
        try:
            claim.probe(view)
            error = None
        except Exception as exc:  # reported to every rank, then everyone aborts
            error = f"{type(exc).__name__}: {exc}"
        _agree(view, {"digest": claim.digest, "error": error}, "complete the call")


def _agree(view: GroupView, mine: dict[str, str | None], step: str) -> None:
    claims: list[dict[str, str | None] | None] = [None] * view.world_size
    dist.all_gather_object(claims, mine, group=view.agreement)
    for rank, other in enumerate(claims):
        assert other is not None
        if other["error"]:
            raise CollectiveAbort(f"rank {rank} could not {step}: {other['error']}; every rank aborts")
    digests = sorted({str(c["digest"]) for c in claims if c is not None})
    if len(digests) > 1:
        raise CollectiveAbort(f"ranks armed different bundles ({', '.join(digests)}); every rank aborts")


def all_reduce_probe(entry: Callable[..., Any]) -> Probe:
    """One real call of an ``all_reduce(x, out, group)`` entry: rank r contributes r+1 everywhere."""

    def probe(view: GroupView) -> None:
        rank = dist.get_rank(view.bundle_group)
        x = torch.full((2, 64), float(rank + 1), device=view.device)
        out = torch.empty_like(x)
        call_entry(entry, (x, out, view.bundle_group), out)
        expected = view.world_size * (view.world_size + 1) / 2
        if not torch.equal(out, torch.full_like(x, expected)):
            got = out.flatten()[:4].tolist()
            raise SeamViolation(f"all_reduce probe: expected every element {expected}, got {got}")

    return probe
