"""Verification orchestration (the trusted side).

For every op of a bundle: spawn an isolated child, and for each dtype and case (registered shapes
plus a seeded token-count jitter) run two trials: fresh buffers, then the *same* buffers refilled
with new values (a result cached by shape or pointer fails the second). The parent keeps its own
copy of every input, computes the float64 reference from it, and judges the child's raw outputs:
storage identity, input immutability, finiteness, then the slot's comparator. On CUDA, op slots
(and graph-safe blocks) are also captured into a CUDA graph and replayed with fresh inputs and
poisoned outputs.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cacheon.bundle.manifest import Manifest, OpEntry
from cacheon.contract.catalog import get_slot
from cacheon.contract.inputs import derive_seed, jitter_case, make_inputs, output_layout
from cacheon.contract.spec import ShapeCase, SlotSpec
from cacheon.errors import CacheonError, UsageError
from cacheon.verify.compare import compare
from cacheon.verify.isolation import CandidateProcess, ChildFailure
from cacheon.verify.report import CaseResult, OpReport, VerifyReport, combine

TRIALS = 2  # fresh buffers, then refilled buffers


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


Progress = Callable[[OpReport, CaseResult], None]


def check_device(device: str) -> None:
    if device == "cpu":
        return
    if device != "cuda":
        raise UsageError(f"unknown device {device!r} (cpu or cuda)")
    if not torch.cuda.is_available():
        raise InfrastructureError("--device cuda requested but torch sees no CUDA device on this host")


def environment(device: str) -> dict[str, Any]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    env: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": version("triton"),
        "triton_interpret": device == "cpu",
    }
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name(0)
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return env


def verify_bundle(
    bundle_dir: Path, manifest: Manifest, digest: str, options: VerifyOptions, progress: Progress | None = None
) -> VerifyReport:
    check_device(options.device)
    ops = [_verify_op(bundle_dir, op, options, progress) for op in manifest.ops]
    verdict, reason = combine(ops)
    return VerifyReport(
        bundle_id=manifest.bundle_id,
        bundle_digest=digest,
        device=options.device,
        seed=options.seed,
        ops=ops,
        environment=environment(options.device),
        verdict=verdict,
        reason=reason,
    )


def _cases(slot: SlotSpec, seed: int) -> Iterator[ShapeCase]:
    for i, case in enumerate(slot.shapes):
        yield case
        yield jitter_case(slot, case, derive_seed(seed, slot.name, "jitter", i))


def _eager_plan(slot: SlotSpec, dtypes: list[str], seed: int) -> Iterator[tuple[str, ShapeCase, int]]:
    for dtype in dtypes:
        for case in _cases(slot, seed):
            for trial in range(TRIALS):
                yield dtype, case, trial


def _dtypes(slot: SlotSpec, op: OpEntry, requested: tuple[str, ...]) -> list[str]:
    for dtype in requested:
        if dtype not in slot.dtypes:
            raise UsageError(f"--dtype {dtype}: {slot.name} runs in {', '.join(slot.dtypes)}")
    return [d for d in op.dtypes if not requested or d in requested]


def _verify_op(bundle_dir: Path, op: OpEntry, options: VerifyOptions, progress: Progress | None) -> OpReport:
    slot = get_slot(op.slot)
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
        with CandidateProcess(bundle_dir, op, options.device, options.timeout) as proc:
            proc.wait_ready(options.import_timeout)
            for dtype, case, trial in _eager_plan(slot, dtypes, options.seed):
                emit(_eager_trial(proc, slot, case, dtype, trial, options.seed))
                if not report.cases[-1].ok and not options.keep_going:
                    report.detail = "stopped at the first failing case (--keep-going runs every case)"
                    break
            graph_ok = _graph_stage(proc, slot, dtypes, options, emit, report)
    except ChildFailure as failure:
        report.verdict = "FAIL"
        report.reason = f"candidate {failure.kind}: {_last_line(failure.detail)}"
        report.detail = failure.detail
        return report
    except (OSError, RuntimeError) as exc:  # spawning or pickling failed: the harness, not the candidate
        raise InfrastructureError(f"verification harness failed for {slot.name}: {exc}") from exc

    failed = [c for c in report.cases if not c.ok]
    if failed:
        first = failed[0]
        report.verdict = "FAIL"
        report.reason = f"{len(failed)} of {len(report.cases)} cases run failed; first: {first.stage} {first.dtype} " \
            f"{first.shape}: {first.failures[0].splitlines()[0]}"
    elif slot.requires_graph_proof() and not graph_ok:
        report.verdict = "NUMERICAL_PASS"
        report.reason = f"numerics match on every case; CUDA-graph replay proof not run ({report.graph})"
    else:
        report.reason = f"{len(report.cases)} cases matched the float64 reference"
    return report


def _judge(
    slot: SlotSpec, case: ShapeCase, dtype: str, inputs: dict[str, torch.Tensor], kind: str, payload: Any
) -> tuple[list[str], float | None, float | None, dict[str, float]]:
    """The parent's judgement of one raw child answer; returns failures and error figures."""
    if kind == "raised":
        return [f"entry raised: {_last_line(payload)}"], None, None, {}
    if not (kind == "result" and isinstance(payload, dict) and _has_result_shape(payload)):
        return ["the candidate process returned a malformed result"], None, None, {}
    failures = [str(v) for v in [*payload["harness"], *payload["violations"]]]
    for name, original in inputs.items():
        after = payload["inputs_after"].get(name)
        if not isinstance(after, torch.Tensor) or after.shape != original.shape or not torch.equal(after, original):
            failures.append(f"input {name} was modified by the candidate (inputs are read-only)")
    reference = slot.reference(inputs, slot.scalars(case))
    tol = slot.comparator.tolerance(dtype)
    max_abs = max_rel = None
    metric: dict[str, float] = {}
    for name, (shape, out_dtype) in output_layout(slot, case, dtype).items():
        got = payload["outputs"].get(name)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape or got.dtype != out_dtype:
            failures.append(f"output {name}: missing or wrong shape/dtype")
            continue
        result = compare(slot.comparator.mode, tol, got, reference[name])
        max_abs, max_rel, metric = result.max_abs_err, result.max_rel_err, result.metric
        if not result.ok:
            failures.append(f"output {name}: {result.detail}")
    return failures, max_abs, max_rel, metric


def _last_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    return lines[-1] if lines else "(no message)"


def _has_result_shape(payload: dict) -> bool:
    return (
        isinstance(payload.get("outputs"), dict)
        and isinstance(payload.get("inputs_after"), dict)
        and isinstance(payload.get("violations"), list)
        and isinstance(payload.get("harness"), list)
    )


def _message(slot: SlotSpec, case: ShapeCase, dtype: str, inputs: dict[str, torch.Tensor], refill: bool) -> dict:
    return {
        "inputs": inputs,
        "outputs": output_layout(slot, case, dtype),
        "scalars": slot.scalars(case),
        "args": list(slot.args),
        "refill": refill,
    }


def _eager_trial(
    proc: CandidateProcess, slot: SlotSpec, case: ShapeCase, dtype: str, trial: int, seed: int
) -> CaseResult:
    inputs = make_inputs(slot, case, dtype, derive_seed(seed, slot.name, dtype, case.label(), trial))
    kind, payload = proc.request("call", _message(slot, case, dtype, inputs, refill=trial > 0))
    failures, max_abs, max_rel, metric = _judge(slot, case, dtype, inputs, kind, payload)
    return CaseResult("eager", dtype, case.label(), trial, not failures, max_abs, max_rel, metric, failures)


def _graph_stage(
    proc: CandidateProcess,
    slot: SlotSpec,
    dtypes: list[str],
    options: VerifyOptions,
    emit: Callable[[CaseResult], None],
    report: OpReport,
) -> bool:
    """CUDA-graph capture + poisoned replays; returns whether the proof ran and passed."""
    if not slot.requires_graph_proof():
        report.graph = "not_required"
        return False
    if options.device != "cuda":
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
    report.graph = f"passed: {options.graph_replays} poisoned replays per case"
    return True


def _graph_case(
    proc: CandidateProcess,
    slot: SlotSpec,
    case: ShapeCase,
    dtype: str,
    options: VerifyOptions,
    emit: Callable[[CaseResult], None],
) -> bool:
    inputs = make_inputs(slot, case, dtype, derive_seed(options.seed, slot.name, dtype, case.label(), "capture"))
    kind, payload = proc.request("capture", _message(slot, case, dtype, inputs, refill=False))
    if kind != "captured":
        emit(CaseResult("graph", dtype, case.label(), 0, False, failures=[f"capture raised: {_last_line(payload)}"]))
        return False
    for replay in range(1, options.graph_replays + 1):
        seed = derive_seed(options.seed, slot.name, dtype, case.label(), "replay", replay)
        fresh = make_inputs(slot, case, dtype, seed)
        inputs = {n: (fresh[n] if n in slot.graph_dynamic else t) for n, t in inputs.items()}
        dynamic = {n: inputs[n] for n in slot.graph_dynamic}
        kind, payload = proc.request("replay", {"inputs": dynamic})
        failures, max_abs, max_rel, metric = _judge(slot, case, dtype, inputs, kind, payload)
        emit(CaseResult("graph", dtype, case.label(), replay, not failures, max_abs, max_rel, metric, failures))
        if failures:
            return False
    return True
