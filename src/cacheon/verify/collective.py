"""Collective slots at the real world size: N rank processes, one process group the harness owns.

Each rank is an isolated child like any other, with its own parent-owned pipe (a rank cannot see
another's channel). Every call goes to all ranks at once; each rank gets its own seeded partials,
and every rank's outputs are judged against the float64 reduction of all partials (plus the slot's
finishing op). One rank that hangs, dies, raises or disagrees fails the whole verification, and a
timeout kills the entire group.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cacheon.bundle.manifest import OpEntry
from cacheon.contract.inputs import derive_seed, make_rank_inputs, refresh_dynamic, stack_partials
from cacheon.contract.spec import SlotSpec
from cacheon.errors import UsageError
from cacheon.verify.isolation import CandidateProcess, ChildFailure
from cacheon.verify.judge import Judgement, judge
from cacheon.verify.report import CaseResult, OpReport
from cacheon.verify.runner import DEFAULT_WORLD_SIZE, VerifyOptions, case_result, cases, limits_for, message


def world_size_for(options: VerifyOptions) -> int:
    world = options.world_size or DEFAULT_WORLD_SIZE
    if world < 2:
        raise UsageError(f"--world-size {world}: a collective needs at least 2 ranks")
    if options.device == "cuda" and torch.cuda.device_count() < world:
        raise UsageError(
            f"--world-size {world} on cuda needs {world} GPUs (nccl, one per rank); "
            f"this host has {torch.cuda.device_count()}"
        )
    return world


def _tagged(rank: int, call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except ChildFailure as failure:
        raise ChildFailure(failure.kind, f"rank {rank}: {failure.detail}") from None


def _merge(verdicts: list[Judgement]) -> Judgement:
    merged = Judgement([f"rank {r}: {f}" for r, v in enumerate(verdicts) for f in v.failures])
    measured = [v for v in verdicts if v.max_abs_err is not None]
    if measured:
        worst = max(measured, key=lambda v: v.max_abs_err or 0.0)
        merged.max_abs_err, merged.max_rel_err, merged.metric = worst.max_abs_err, worst.max_rel_err, worst.metric
    return merged


def run_collective(
    bundle_dir: Path,
    op: OpEntry,
    slot: SlotSpec,
    dtypes: list[str],
    options: VerifyOptions,
    emit: Callable[[CaseResult], None],
    report: OpReport,
) -> bool:
    world = world_size_for(options)
    report.graph = "not_required"
    limits = limits_for(options.device, collective=True)
    with tempfile.TemporaryDirectory(prefix="cacheon-rendezvous-") as rendezvous, contextlib.ExitStack() as stack:
        init = f"file://{rendezvous}/store"
        procs = [
            stack.enter_context(
                CandidateProcess(
                    bundle_dir, op, options.device, options.timeout, limits,
                    {"rank": r, "world": world, "init_method": init},
                )
            )
            for r in range(world)
        ]
        try:
            for r, proc in enumerate(procs):
                _tagged(r, proc.wait_ready, options.import_timeout)
            report.isolation = {**procs[0].isolation, "world_size": world}
            if not _all_cases(procs, slot, dtypes, options, emit):
                report.detail = "stopped at the first failing case (--keep-going runs every case)"
        finally:
            report.candidate_output = "\n".join(
                f"[rank {r}] {tail}" for r, p in enumerate(procs) if (tail := p.output_tail())
            )
            for proc in procs:
                proc.kill()  # one rank's failure ends the whole group
    return False


def _all_cases(
    procs: list[CandidateProcess], slot: SlotSpec, dtypes: list[str], options: VerifyOptions,
    emit: Callable[[CaseResult], None],
) -> bool:
    world = len(procs)
    for dtype in dtypes:
        for case in cases(slot, options.seed):
            ranks: list[dict[str, torch.Tensor]] = []
            for trial in range(2):
                seed = derive_seed(options.seed, slot.name, dtype, case.label(), trial)
                fresh = make_rank_inputs(slot, case, dtype, seed, world)
                ranks = [refresh_dynamic(slot, ranks[r], fresh[r]) for r in range(world)] if trial else fresh
                for r, proc in enumerate(procs):
                    _tagged(r, proc.send, "call", message(slot, case, dtype, ranks[r], trial > 0))
                answers = [_tagged(r, proc.receive) for r, proc in enumerate(procs)]
                reference = slot.reference(stack_partials(slot, ranks), slot.scalars(case))
                verdict = _merge(
                    [judge(slot, case, dtype, ranks[r], reference, *answers[r]) for r in range(world)]
                )
                emit(case_result("eager", dtype, case, trial, verdict))
                if not verdict.ok and not options.keep_going:
                    return False
    return True
