"""Verification of an admitted bundle: one sandbox per op, the stages in order, judged in this process.

For each op the candidate runs in its own sandbox (all ranks of a collective in one), through
the eager (or collective) stage, the graph stage where the slot needs a CUDA-graph proof, and
the stability stage. Every output is judged here against the slot's float64 reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cacheon.bundle.manifest import Manifest, OpEntry
from cacheon.bundle.snapshot import Snapshot
from cacheon.contract.catalog import get_slot
from cacheon.contract.profiles import apply_profile
from cacheon.contract.spec import SlotSpec
from cacheon.errors import UsageError
from cacheon.runtime.identity import runtime_identity
from cacheon.verify import stages
from cacheon.verify.deadline import Deadline, earliest
from cacheon.verify.launcher import CandidateGroup, ChildFailure, InfrastructureError
from cacheon.verify.plan import (
    DEFAULT_WORLD_SIZE,
    Confinement,
    VerifyOptions,
    draw_seed,
    eager_cases,
    stability_plan,
)
from cacheon.verify.report import (
    CaseResult,
    GraphStatus,
    OpReport,
    Stage,
    StageProgress,
    StageResult,
    Verdict,
    VerifyReport,
    combine,
)
from cacheon.verify.sandbox import require_bubblewrap

__all__ = ["InfrastructureError", "VerifyOptions", "verify_bundle"]

#: torch threads while judging: most calls are small, where threads cost more than they gain
PARENT_THREADS = 1
#: called with the slot's comparator mode and each judged case (or a finished stability stage)
Progress = Callable[[str, CaseResult | StageResult | StageProgress], None]


def check_device(device: str) -> None:
    if device == "cpu":
        return
    if device != "cuda":
        raise UsageError(f"unknown device {device!r} (cpu or cuda)")
    if not torch.cuda.is_available():
        raise InfrastructureError("--device cuda requested but torch sees no CUDA device on this host")


def environment(device: str) -> dict[str, Any]:
    """The run's facts, taken from the runtime identity capture (one source for versions and GPUs)."""
    identity = runtime_identity()
    facts = identity.facts
    env: dict[str, Any] = {
        "device": device,
        "torch": facts["packages"]["torch"],
        "torch_cuda": facts["torch_cuda"],
        "triton": facts["packages"]["triton"],
        "triton_interpret": device == "cpu",
        "identity": identity.digest,
    }
    if device == "cuda":
        first = facts["gpu"]["devices"][0]
        env["gpu"], env["capability"] = first["name"], first["capability"]
    return env


def world_size_for(slot: SlotSpec, options: VerifyOptions) -> int:
    if slot.kind != "collective":
        return 1
    world = options.world_size or DEFAULT_WORLD_SIZE
    if world < 2:
        raise UsageError(f"--world-size {world}: a collective needs at least 2 ranks")
    if options.device == "cuda" and torch.cuda.device_count() < world:
        raise UsageError(
            f"--world-size {world} on cuda needs {world} GPUs (nccl, one per rank); "
            f"this host has {torch.cuda.device_count()}"
        )
    return world


def verify_bundle(
    bundle: Snapshot, manifest: Manifest, options: VerifyOptions, progress: Progress | None = None,
    seed: int | None = None,
) -> VerifyReport:
    """Verify every op of an admitted bundle snapshot: each child runs a copy written from its bytes,
    and the report names its digest. ``seed`` (else ``options.seed``, else OS entropy) decides every
    draw of the run."""
    digest = bundle.require_digest()
    check_device(options.device)
    slots = [get_slot(op.slot) for op in manifest.ops]
    if options.world_size is not None and not any(s.kind == "collective" for s in slots):
        raise UsageError("--world-size applies to collective slots only; this bundle has none")
    if options.confinement is Confinement.BUBBLEWRAP:
        require_bubblewrap()
    run_seed = seed if seed is not None else options.seed if options.seed is not None else draw_seed()
    chosen = chosen_ops(manifest, options, run_seed)
    declared = manifest.declared_files()
    threads = torch.get_num_threads()
    torch.set_num_threads(PARENT_THREADS)
    run_deadline = Deadline.after(options.run_timeout, f"the run's {options.run_timeout:g}s (--run-timeout)")
    try:
        ops = [_verify_op(bundle, declared, op, options, run_seed, progress, case, run_deadline)
               for op, case in chosen]
    finally:
        torch.set_num_threads(threads)
    verdict, reason = combine(ops)
    env = environment(options.device)
    if options.profile is not None:
        env["model_profile"] = options.profile.key
    return VerifyReport(
        bundle_id=manifest.bundle_id, bundle_digest=digest, device=options.device, seed=run_seed,
        confinement=options.confinement.value, ops=ops, environment=env, verdict=verdict, reason=reason,
        case=options.case, unjudged=_unjudged(chosen, options),
    )


def _unjudged(chosen: list[tuple[OpEntry, str | None]], options: VerifyOptions) -> dict[str, list[str]]:
    """The dtypes each op's manifest declares that ``--dtype`` left out: what a narrowed verdict does not cover."""
    left = {op.slot: [d for d in op.dtypes if d not in _dtypes(_slot_for(op, options), op, options.dtypes)]
            for op, _ in chosen}
    return {slot: dtypes for slot, dtypes in left.items() if dtypes}


def chosen_ops(manifest: Manifest, options: VerifyOptions, seed: int) -> list[tuple[OpEntry, str | None]]:
    """Every op with no case chosen; with ``--case [SLOT:]ID``, the ops that have that case, each with
    the case's id. An id no op has is a usage error that names the ids there are."""
    if options.case is None:
        return [(op, None) for op in manifest.ops]
    slot_name, _, wanted = options.case.rpartition(":")
    chosen: list[tuple[OpEntry, str | None]] = []
    known: list[str] = []
    for op in manifest.ops:
        if slot_name and op.slot != slot_name:
            continue
        slot = _slot_for(op, options)
        dtypes = _dtypes(slot, op, options.dtypes)
        ids = [p.id for d in dtypes for p in eager_cases(slot, d, seed)]
        kinds = " ".join(dict.fromkeys(i.partition("/")[2] for i in ids))
        known.append(f"{op.slot}: DTYPE/KI, DTYPE in {', '.join(dtypes)}, KI in {kinds}")
        if wanted in ids:
            chosen.append((op, wanted))
    if not chosen:
        listed = "; ".join(known) or f"no op has slot {slot_name} (the bundle's: " + \
            ", ".join(o.slot for o in manifest.ops) + ")"
        raise UsageError(f"--case {options.case}: no such case; {listed}")
    return chosen


def _slot_for(op: OpEntry, options: VerifyOptions) -> SlotSpec:
    """The op's slot as judged in this run: the model profile's specialisation where one is chosen."""
    slot = get_slot(op.slot)
    return apply_profile(slot, options.profile) if options.profile is not None else slot


def _dtypes(slot: SlotSpec, op: OpEntry, requested: tuple[str, ...]) -> list[str]:
    for dtype in requested:
        if dtype not in slot.dtypes:
            raise UsageError(f"--dtype {dtype}: {slot.name} runs in {', '.join(slot.dtypes)}")
    return [d for d in op.dtypes if not requested or d in requested]


def _verify_op(
    bundle: Snapshot, declared: tuple[str, ...], op: OpEntry, options: VerifyOptions, seed: int,
    progress: Progress | None, case: str | None, run_deadline: Deadline,
) -> OpReport:
    slot = _slot_for(op, options)
    dtypes = _dtypes(slot, op, options.dtypes)
    if case is not None:
        dtypes = [case.partition("/")[0]]  # the case's own dtype: no other is planned

    def report(verdict: Verdict, reason: str, **rest: Any) -> OpReport:
        return OpReport(slot.name, op.entry, op.source, slot.comparator.mode, verdict, reason, **rest)

    if not dtypes:
        return report("FAIL", "no dtype left to verify (manifest dtypes ∩ --dtype is empty)")
    if run_deadline.passed():  # the ops before this one took the run's time: none of it is left
        return report("FAIL", f"not run: {run_deadline.what} passed before this op started")
    world = world_size_for(slot, options)
    deadline = earliest(Deadline.after(options.op_timeout, f"the op's {options.op_timeout:g}s (--op-timeout)"),
                        run_deadline)

    def emit(result: CaseResult | StageResult | StageProgress) -> None:
        if progress is not None:
            progress(slot.comparator.mode, result)

    done: list[StageResult] = []
    applied: dict[str, str] = {}
    try:
        group = CandidateGroup(bundle, declared, op, options.device, world, options.confinement,
                               options.resolved_limits(), options.timeout, deadline=deadline)
    except OSError as exc:  # starting the child failed: the harness, not the candidate
        raise InfrastructureError(f"verification harness failed for {slot.name}: {exc}") from exc
    with group:
        try:
            applied = {**group.boot(options.import_timeout), "world_size": str(world)}
            _run_stages(stages.Run(slot, dtypes, options, seed, group, emit, case), done, emit)
            left = group.extra_processes()
        except ChildFailure as failure:
            return report("FAIL", f"candidate {failure.kind}: {failure.reason}", stages=tuple(done),
                          confinement=applied, candidate_output=group.output_tail(),
                          candidate_output_bytes=group.output_bytes, detail=failure.detail)
        output, printed = group.output_tail(), group.output_bytes
    verdict, reason = _conclude(slot, done, left, case)
    detail = next((c.detail for s in done for c in s.cases if c.detail), "")
    return report(verdict, reason, stages=tuple(done), confinement=applied, candidate_output=output,
                  candidate_output_bytes=printed, detail=detail)


def _run_stages(run: stages.Run, done: list[StageResult], emit: Callable[[StageResult], None]) -> None:
    """Eager (collective), graph (world 1), stability; a failed stage ends the op unless --keep-going."""
    keep_going = run.options.keep_going
    done.append(stages.eager(run))
    if run.case is not None:  # one case, for its author: no graph or stability stage
        return
    if run.world == 1:
        done.append(stages.graph(run, done[-1].ok))
    if not (keep_going or all(s.ok for s in done)):
        done.append(StageResult(Stage.STABILITY, skipped="an earlier stage failed"))
        return
    plan = stability_plan(run.slot, run.dtypes, run.seed, run.options.stability_calls)
    if not plan.calls:
        done.append(StageResult(Stage.STABILITY, skipped="--stability-calls 0"))
        return
    done.append(stages.stability(run, plan))
    emit(done[-1])


def _conclude(slot: SlotSpec, done: list[StageResult], left: int | None, case: str | None) -> tuple[Verdict, str]:
    cases = [c for s in done for c in s.cases]
    failed = [c for c in cases if not c.ok]
    if failed:
        first = failed[0]
        return "FAIL", (
            f"{len(failed)} of {len(cases)} judged calls failed; first: {first.stage.value} "
            f"{first.case_id or first.dtype} {first.shape} #{first.trial}: {first.failures[0].splitlines()[0]}"
        )
    if left:
        return "FAIL", f"the candidate left {left} process(es) running in the sandbox (killed with it)"
    if case is not None:
        return "PASS", f"case {case} matched the float64 reference ({len(cases)} calls); only this case ran"
    graph = next((s.graph for s in done if s.graph is not None), None)
    if slot.requires_graph_proof() and (graph is None or graph.status is not GraphStatus.PASSED):
        return "NUMERICAL_PASS", f"numerics match on every case; CUDA-graph replay proof not run ({graph})"
    stability = next((s for s in done if s.stage is Stage.STABILITY and not s.skipped), None)
    extra = f"; {stability.checked} of {stability.calls} stability calls judged" if stability else ""
    return "PASS", f"{len(cases)} cases matched the float64 reference{extra}"
