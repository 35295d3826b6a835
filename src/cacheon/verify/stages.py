"""The stages of one op's verification. Each takes the running candidate and returns its result.

- eager (``collective`` at world size > 1): every planned case, fresh buffers then a refill;
- graph: CUDA-graph capture of each registered shape, then poisoned replays with fresh inputs;
- stability: ``--stability-calls`` calls interleaved across small buffer sets in random order,
  every one judged (a kernel wrong once in a while is caught at that call).

Every call also carries the context that keeps the harness from being told apart from serving:
its poison (stale data: the previous call's reference outputs, this call's inputs shifted, or
synthetic values) and the number of extra stack frames the child calls the entry under.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from cacheon.contract.inputs import (
    Inputs,
    Statistics,
    derive_seed,
    draw_statistics,
    make_rank_inputs,
    output_layout,
    reference_inputs,
    refresh_dynamic,
)
from cacheon.contract.spec import ShapeCase, SlotSpec
from cacheon.verify import channel
from cacheon.verify.graphs import CUDA_BACKEND
from cacheon.verify.judge import Judgement, judge_ranks
from cacheon.verify.launcher import CandidateGroup, InfrastructureError
from cacheon.verify.messages import BackendFailed, Call, Capture, Captured, OutputSpec, Poison, Raised, Replay, Reply
from cacheon.verify.plan import StabilityPlan, VerifyOptions, eager_cases
from cacheon.verify.poison import draw_poison, reference_pool
from cacheon.verify.report import CaseResult, GraphResult, GraphStatus, Stage, StageProgress, StageResult
from cacheon.verify.rounding import rounding_errors
from cacheon.verify.untrusted import one_line

Emit = Callable[[CaseResult | StageProgress], None]
EAGER_BUFFERS, GRAPH_BUFFERS, STABILITY_BUFFERS = 0, 1, 100
#: the most extra frames a call is made under: the child's own depth is about 8, and the pin nests
#: a kernel some 30-60 frames deep (scheduler loop, model runner, two frames per nn.Module call),
#: so the depths a kernel sees span serving's and any threshold on them is crossed by judged calls
MAX_EXTRA_FRAMES = 96


@dataclass
class Run:
    """What every stage of one op shares: the slot, the candidate, the options and the run seed."""

    slot: SlotSpec
    dtypes: list[str]
    options: VerifyOptions
    seed: int
    group: CandidateGroup
    emit: Emit
    case: str | None = None  # the one eager case to run (--case), by its id; None: every case
    _seq: int = field(default=0)
    _pool: torch.Tensor | None = None  # the last reference's outputs: stale data for later poison

    @property
    def world(self) -> int:
        return self.group.world

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def poison(self, *labels: object) -> Poison:
        return self.poison_from(random.Random(derive_seed(self.seed, self.slot.name, "poison", *labels)))

    def poison_from(self, rng: random.Random) -> Poison:
        return draw_poison(rng, self._pool)

    def frames(self, seq: int) -> int:
        return random.Random(derive_seed(self.seed, self.slot.name, "frames", seq)).randint(0, MAX_EXTRA_FRAMES)

    def inputs(self, case: ShapeCase, dtype: str, seed: int, stats: Statistics | None,
               only: frozenset[str] | None = None) -> list[Inputs]:
        return make_rank_inputs(self.slot, case, dtype, seed, self.world, stats, only)

    def calls(self, seq: int, buffers: int, case: ShapeCase, dtype: str, ranks: list[Inputs], refill: bool,
              poison: Poison) -> list[Call]:
        """One call per rank: on refill only the graph-dynamic inputs travel (static ones stay put)."""
        layout = {n: OutputSpec(list(shape), channel.dtype_name(dt)) for n, (shape, dt)
                  in output_layout(self.slot, case, dtype).items()}
        sent = set(self.slot.graph_dynamic) if refill else None
        scalars = self.slot.scalars(case)
        prepare = [] if refill else list(self.slot.prepare_inputs)
        shipped = [{n: t for n, t in r.items() if sent is None or n in sent} for r in ranks]
        frames = self.frames(seq)
        return [
            Call(seq, buffers, refill, channel.tensors_to_wire(inputs), layout, scalars, list(self.slot.args),
                 prepare, poison, frames)
            for inputs in shipped
        ]

    def judge(self, case: ShapeCase, dtype: str, ranks: list[Inputs], replies: list[Reply],
              poison: Poison | None = None) -> Judgement:
        inputs, scalars = reference_inputs(self.slot, ranks), self.slot.scalars(case)
        reference = self.slot.reference(inputs, scalars)
        self._pool = reference_pool(reference)
        rounding = rounding_errors(self.slot, dtype, inputs, scalars, reference)
        return judge_ranks(self.slot, case, dtype, ranks, reference, replies, poison, rounding)


def case_result(
    stage: Stage, dtype: str, case: ShapeCase, trial: int, verdict: Judgement, note: str = "", case_id: str = ""
) -> CaseResult:
    return CaseResult(stage, dtype, case.label(), trial, verdict.ok, verdict.max_abs_err, verdict.max_rel_err,
                      verdict.metric, tuple(verdict.failures), note, verdict.detail, case_id,
                      verdict.tolerance, tuple(verdict.worst), verdict.returned)


def eager(run: Run) -> StageResult:
    """Every planned case of every dtype; stops at the first failure unless --keep-going."""
    stage = Stage.COLLECTIVE if run.world > 1 else Stage.EAGER
    results: list[CaseResult] = []
    for dtype in run.dtypes:
        for planned in eager_cases(run.slot, dtype, run.seed):
            if run.case is not None and planned.id != run.case:
                continue
            case, label = planned.case, planned.case.label()
            ranks: list[Inputs] = []
            for trial in range(planned.trials):
                seed = derive_seed(run.seed, run.slot.name, dtype, planned.kind.value, label, trial)
                fresh = run.inputs(case, dtype, seed, planned.statistics)
                ranks = [refresh_dynamic(run.slot, ranks[r], fresh[r]) for r in range(run.world)] if trial else fresh
                seq = run.next_seq()
                poison = run.poison(dtype, label, trial)
                replies = run.group.exchange(run.calls(seq, EAGER_BUFFERS, case, dtype, ranks, trial > 0, poison), seq)
                result = case_result(stage, dtype, case, trial, run.judge(case, dtype, ranks, replies, poison),
                                     planned.note(), planned.id)
                results.append(result)
                run.emit(result)
                if not result.ok and not run.options.keep_going:
                    return StageResult(stage, tuple(results), stopped=True)
    return StageResult(stage, tuple(results))


def graph(run: Run, eager_ok: bool) -> StageResult:
    """CUDA-graph capture + poisoned replays; only the CUDA backend on a CUDA device is a proof."""
    options = run.options

    def standing(status: GraphStatus, detail: str, cases: tuple[CaseResult, ...] = ()) -> StageResult:
        return StageResult(Stage.GRAPH, cases, graph=GraphResult(status, detail))

    if not run.slot.requires_graph_proof():
        return standing(GraphStatus.NOT_REQUIRED, "")
    if options.device != "cuda" and options.graph_backend == CUDA_BACKEND:
        return standing(GraphStatus.NOT_RUN, "CUDA graphs need --device cuda")
    if options.graph_replays < 1:
        return standing(GraphStatus.NOT_RUN, "--graph-replays 0")
    if not eager_ok:
        return standing(GraphStatus.NOT_RUN, "eager stage failed")
    results: list[CaseResult] = []
    for dtype in run.dtypes:
        for case in run.slot.shapes:
            if not _graph_case(run, case, dtype, results):
                return standing(GraphStatus.FAILED, f"{dtype} {case.label()}", tuple(results))
    if not options.graph_is_proof:
        return standing(GraphStatus.EMULATED, f"{options.graph_backend}: replays matched, but this is no "
                        "CUDA-graph proof", tuple(results))
    return standing(GraphStatus.PASSED, f"{options.graph_replays} poisoned replays per case", tuple(results))


def _graph_case(run: Run, case: ShapeCase, dtype: str, results: list[CaseResult]) -> bool:
    label = case.label()
    ranks = run.inputs(case, dtype, derive_seed(run.seed, run.slot.name, dtype, label, "capture"), None)
    seq = run.next_seq()
    [call] = run.calls(seq, GRAPH_BUFFERS, case, dtype, ranks, False, run.poison(dtype, label, "capture"))
    [reply] = run.group.exchange([Capture(call, run.options.graph_backend)], seq)
    if isinstance(reply, BackendFailed):
        raise InfrastructureError(f"graph backend {run.options.graph_backend} failed: {one_line(reply.detail)}")
    if not isinstance(reply, Captured):
        reason = one_line(reply.reason) if isinstance(reply, Raised) else "no capture"
        result = case_result(Stage.GRAPH, dtype, case, 0, Judgement([f"capture raised: {reason}"]))
        results.append(result)
        run.emit(result)
        return False
    for replay in range(1, run.options.graph_replays + 1):
        seed = derive_seed(run.seed, run.slot.name, dtype, label, "replay", replay)
        ranks = [refresh_dynamic(run.slot, ranks[0], run.inputs(case, dtype, seed, None)[0])]
        seq = run.next_seq()
        dynamic = {n: ranks[0][n] for n in run.slot.graph_dynamic}
        poison = run.poison(dtype, label, "replay", replay)
        message = Replay(seq, GRAPH_BUFFERS, channel.tensors_to_wire(dynamic), poison)
        replies = run.group.exchange([message], seq)
        result = case_result(Stage.GRAPH, dtype, case, replay, run.judge(case, dtype, ranks, replies, poison))
        results.append(result)
        run.emit(result)
        if not result.ok:
            return False
    return True


def stability(run: Run, plan: StabilityPlan) -> StageResult:
    """Many calls, interleaved across buffer sets in random order, every one judged (each has fresh
    inputs: a repeated input would tell a kernel it is being tested, serving never repeats one).
    Stops at the first failure unless --keep-going."""
    sets = {s.key: s for s in plan.sets}
    held: dict[int, list[Inputs]] = {}
    failures: list[CaseResult] = []
    made = 0
    for call in plan.calls:
        spec = sets[call.key]
        stats = draw_statistics(run.slot, random.Random(call.seed))
        dynamic = frozenset(run.slot.graph_dynamic) if call.refill else None
        fresh = run.inputs(spec.case, spec.dtype, call.seed, stats, dynamic)
        ranks = [refresh_dynamic(run.slot, held[call.key][r], fresh[r]) for r in range(run.world)] \
            if call.refill else fresh
        held[call.key] = ranks
        seq = run.next_seq()
        poison = run.poison_from(random.Random(call.seed ^ 0x5EED))
        replies = run.group.exchange(
            run.calls(seq, STABILITY_BUFFERS + call.key, spec.case, spec.dtype, ranks, call.refill, poison), seq)
        made += 1
        run.emit(StageProgress(Stage.STABILITY, made, len(plan.calls)))
        verdict = run.judge(spec.case, spec.dtype, ranks, replies, poison)
        if not verdict.ok:
            note = f"call {made} of {len(plan.calls)}"
            result = case_result(Stage.STABILITY, spec.dtype, spec.case, made, verdict, note)
            failures.append(result)
            run.emit(result)
            if not run.options.keep_going:
                return StageResult(Stage.STABILITY, tuple(failures), stopped=True, calls=made, checked=made)
    return StageResult(Stage.STABILITY, tuple(failures), calls=made, checked=made)
