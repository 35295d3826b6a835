"""Verification orchestration (the trusted side).

For every op of a bundle: spawn an isolated child, and for each dtype and case (registered shapes
plus a seeded token-count jitter) run two trials: fresh buffers, then the *same* buffers refilled
with new graph-dynamic values (a result cached by shape or pointer fails the second). The parent
keeps its own copy of every input, computes the float64 reference from it, and judges the child's
raw outputs: storage identity, input immutability, finiteness, then the slot's comparator. On
CUDA, op slots (and graph-safe blocks) are also captured into a CUDA graph and replayed with fresh
inputs and poisoned outputs. Collective slots run at the real world size (see ``collective``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cacheon.bundle.manifest import Manifest, OpEntry
from cacheon.contract.catalog import get_slot
from cacheon.contract.inputs import derive_seed, jitter_case, make_inputs, output_layout, refresh_dynamic
from cacheon.contract.profiles import Profile, apply_profile
from cacheon.contract.spec import ShapeCase, SlotSpec
from cacheon.errors import CacheonError, UsageError
from cacheon.runtime.identity import runtime_identity
from cacheon.verify.graphs import CUDA_BACKEND
from cacheon.verify.isolation import CandidateProcess, ChildFailure
from cacheon.verify.judge import Judgement, judge, last_line
from cacheon.verify.report import CaseResult, OpReport, VerifyReport, combine
from cacheon.verify.sandbox import Limits


class InfrastructureError(CacheonError):
    """The harness itself could not run (exit 1): not the candidate's fault."""


@dataclass(frozen=True)
class VerifyOptions:
    device: str = "cpu"
    dtypes: tuple[str, ...] = ()
    seed: int = 0
    timeout: float = 120.0
    import_timeout: float = 120.0
    graph_replays: int = 3
    keep_going: bool = False
    world_size: int | None = None  # collectives; None means the default of 2
    profile: Profile | None = None
    #: ``module:Class`` of the graph backend; only the CUDA one on a CUDA device is a proof. Tests
    #: inject an emulation to exercise the orchestration on CPU.
    graph_backend: str = CUDA_BACKEND

    @property
    def graph_is_proof(self) -> bool:
        return self.device == "cuda" and self.graph_backend == CUDA_BACKEND


Emit = Callable[[CaseResult], None]
Progress = Callable[[OpReport, CaseResult], None]
DEFAULT_WORLD_SIZE = 2


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


def limits_for(device: str, collective: bool) -> Limits:
    return Limits(address_space_bytes=None if device == "cuda" else Limits.address_space_bytes, network=collective)


def verify_bundle(
    bundle_dir: Path, manifest: Manifest, digest: str, options: VerifyOptions, progress: Progress | None = None
) -> VerifyReport:
    check_device(options.device)
    slots = [get_slot(op.slot) for op in manifest.ops]
    if options.world_size is not None and not any(s.kind == "collective" for s in slots):
        raise UsageError("--world-size applies to collective slots only; this bundle has none")
    ops = [_verify_op(bundle_dir, op, options, progress) for op in manifest.ops]
    verdict, reason = combine(ops)
    env = environment(options.device)
    if options.profile is not None:
        env["model_profile"] = options.profile.key
    return VerifyReport(
        bundle_id=manifest.bundle_id,
        bundle_digest=digest,
        device=options.device,
        seed=options.seed,
        ops=ops,
        environment=env,
        verdict=verdict,
        reason=reason,
    )


def cases(slot: SlotSpec, seed: int) -> Iterator[ShapeCase]:
    for i, case in enumerate(slot.shapes):
        yield case
        yield jitter_case(slot, case, derive_seed(seed, slot.name, "jitter", i))


def _dtypes(slot: SlotSpec, op: OpEntry, requested: tuple[str, ...]) -> list[str]:
    for dtype in requested:
        if dtype not in slot.dtypes:
            raise UsageError(f"--dtype {dtype}: {slot.name} runs in {', '.join(slot.dtypes)}")
    return [d for d in op.dtypes if not requested or d in requested]


def _verify_op(bundle_dir: Path, op: OpEntry, options: VerifyOptions, progress: Progress | None) -> OpReport:
    slot = get_slot(op.slot)
    if options.profile is not None:
        slot = apply_profile(slot, options.profile)
    report = OpReport(slot=slot.name, entry=op.entry, source=op.source, mode=slot.comparator.mode)
    dtypes = _dtypes(slot, op, options.dtypes)
    if not dtypes:
        report.verdict, report.reason = "FAIL", "no dtype left to verify (manifest dtypes ∩ --dtype is empty)"
        return report

    def emit(result: CaseResult) -> None:
        report.cases.append(result)
        if progress is not None:
            progress(report, result)

    try:
        if slot.kind == "collective":
            from cacheon.verify.collective import run_collective

            graph_ok = run_collective(bundle_dir, op, slot, dtypes, options, emit, report)
        else:
            graph_ok = _run_single(bundle_dir, op, slot, dtypes, options, emit, report)
    except ChildFailure as failure:
        report.verdict = "FAIL"
        report.reason = f"candidate {failure.kind}: {last_line(failure.detail)}"
        report.detail = failure.detail
        return report
    except (OSError, RuntimeError) as exc:  # spawning or pickling failed: the harness, not the candidate
        raise InfrastructureError(f"verification harness failed for {slot.name}: {exc}") from exc
    _conclude(report, slot, graph_ok)
    return report


def _conclude(report: OpReport, slot: SlotSpec, graph_ok: bool) -> None:
    failed = [c for c in report.cases if not c.ok]
    if failed:
        first = failed[0]
        report.verdict = "FAIL"
        report.reason = (
            f"{len(failed)} of {len(report.cases)} cases run failed; first: {first.stage} {first.dtype} "
            f"{first.shape} #{first.trial}: {first.failures[0].splitlines()[0]}"
        )
    elif slot.requires_graph_proof() and not graph_ok:
        report.verdict = "NUMERICAL_PASS"
        report.reason = f"numerics match on every case; CUDA-graph replay proof not run ({report.graph})"
    else:
        report.reason = f"{len(report.cases)} cases matched the float64 reference"


def message(slot: SlotSpec, case: ShapeCase, dtype: str, inputs: dict[str, torch.Tensor], refill: bool) -> dict:
    """A call: on refill only the graph-dynamic inputs travel (static ones stay in their buffers)."""
    sent = {n: inputs[n] for n in slot.graph_dynamic} if refill else inputs
    msg: dict[str, Any] = {
        "inputs": sent,
        "outputs": output_layout(slot, case, dtype),
        "scalars": slot.scalars(case),
        "args": list(slot.args),
        "refill": refill,
    }
    if slot.prepare_inputs and not refill:
        msg["prepare"] = list(slot.prepare_inputs)
    return msg


def case_result(stage: str, dtype: str, case: ShapeCase, trial: int, verdict: Judgement) -> CaseResult:
    return CaseResult(
        stage, dtype, case.label(), trial, verdict.ok, verdict.max_abs_err, verdict.max_rel_err,
        verdict.metric, verdict.failures,
    )


def _run_single(
    bundle_dir: Path, op: OpEntry, slot: SlotSpec, dtypes: list[str], options: VerifyOptions, emit: Emit,
    report: OpReport,
) -> bool:
    limits = limits_for(options.device, collective=False)
    with CandidateProcess(bundle_dir, op, options.device, options.timeout, limits) as proc:
        try:
            proc.wait_ready(options.import_timeout)
            report.isolation = proc.isolation
            if not _eager_stage(proc, slot, dtypes, options, emit):
                report.detail = "stopped at the first failing case (--keep-going runs every case)"
                return False
            return _graph_stage(proc, slot, dtypes, options, emit, report)
        finally:
            report.candidate_output = proc.output_tail()


def _eager_stage(proc: CandidateProcess, slot: SlotSpec, dtypes: list[str], options: VerifyOptions, emit: Emit) -> bool:
    """Returns False when it stopped early at a failure."""
    for dtype in dtypes:
        for case in cases(slot, options.seed):
            inputs: dict[str, torch.Tensor] = {}
            for trial in range(2):
                fresh = make_inputs(slot, case, dtype, derive_seed(options.seed, slot.name, dtype, case.label(), trial))
                inputs = refresh_dynamic(slot, inputs, fresh) if trial else fresh
                kind, payload = proc.request("call", message(slot, case, dtype, inputs, refill=trial > 0))
                reference = slot.reference(inputs, slot.scalars(case))
                verdict = judge(slot, case, dtype, inputs, reference, kind, payload)
                emit(case_result("eager", dtype, case, trial, verdict))
                if not verdict.ok and not options.keep_going:
                    return False
    return True


def _graph_stage(
    proc: CandidateProcess, slot: SlotSpec, dtypes: list[str], options: VerifyOptions, emit: Emit, report: OpReport
) -> bool:
    """CUDA-graph capture + poisoned replays; returns whether the proof ran and passed."""
    if not slot.requires_graph_proof():
        report.graph = "not_required"
        return False
    if options.device != "cuda" and options.graph_backend == CUDA_BACKEND:
        report.graph = "not_run: CUDA graphs need --device cuda"
        return False
    if options.graph_replays < 1:
        report.graph = "not_run: --graph-replays 0"
        return False
    if any(not c.ok for c in report.cases):
        report.graph = "not_run: eager stage failed"
        return False
    for dtype in dtypes:
        for case in slot.shapes:
            if not _graph_case(proc, slot, case, dtype, options, emit):
                report.graph = "failed"
                return False
    if not options.graph_is_proof:
        report.graph = f"emulated ({options.graph_backend}): replays matched, but this is no CUDA-graph proof"
        return False
    report.graph = f"passed: {options.graph_replays} poisoned replays per case"
    return True


def _graph_case(
    proc: CandidateProcess, slot: SlotSpec, case: ShapeCase, dtype: str, options: VerifyOptions, emit: Emit
) -> bool:
    inputs = make_inputs(slot, case, dtype, derive_seed(options.seed, slot.name, dtype, case.label(), "capture"))
    kind, payload = proc.request("capture", {**message(slot, case, dtype, inputs, refill=False),
                                             "backend": options.graph_backend})
    if kind == "infra_error":
        raise InfrastructureError(f"graph backend {options.graph_backend} failed: {last_line(payload)}")
    if kind != "captured":
        emit(case_result("graph", dtype, case, 0, Judgement([f"capture raised: {last_line(payload)}"])))
        return False
    for replay in range(1, options.graph_replays + 1):
        seed = derive_seed(options.seed, slot.name, dtype, case.label(), "replay", replay)
        inputs = refresh_dynamic(slot, inputs, make_inputs(slot, case, dtype, seed))
        kind, payload = proc.request("replay", {"inputs": {n: inputs[n] for n in slot.graph_dynamic}})
        verdict = judge(slot, case, dtype, inputs, slot.reference(inputs, slot.scalars(case)), kind, payload)
        emit(case_result("graph", dtype, case, replay, verdict))
        if not verdict.ok:
            return False
    return True

