"""What one verification will do: its options, the limits of the candidate's process, and the cases.

Every draw (shapes, input statistics, poison, call depths, the stability stage's order)
comes from one run seed. Without ``--seed`` the seed is drawn from OS entropy, so a candidate
cannot know in advance what it will be asked; the seed is printed and recorded, and passing it
back reproduces the run exactly.
"""

from __future__ import annotations

import math
import random
import secrets
from dataclasses import dataclass
from enum import StrEnum

from cacheon.contract.inputs import (
    Statistics,
    derive_seed,
    draw_statistics,
    input_elements,
    jitter_case,
    with_tokens,
)
from cacheon.contract.profiles import Profile
from cacheon.contract.serving import chosen_counts
from cacheon.contract.spec import ShapeCase, SlotSpec
from cacheon.verify.graphs import CUDA_BACKEND

#: a drawn case ships at most this many elements per rank (keeps the largest batches CPU-sized)
DRAWN_ELEMENT_BUDGET = 1 << 24
#: a stability call ships at most this many elements per rank, when a registered case allows it
STABILITY_ELEMENT_BUDGET = 1 << 18
STABILITY_MAX_TOKENS = 4
DEFAULT_WORLD_SIZE = 2
#: an op's and a run's wall-clock deadlines (--op-timeout, --run-timeout): a child that answers
#: just under every per-call --timeout still ends here. An op bundle verifies in well under a
#: minute on CPU; the op's bound matches the child's CPU-seconds limit.
DEFAULT_OP_TIMEOUT = 1800.0
DEFAULT_RUN_TIMEOUT = 7200.0


class Confinement(StrEnum):
    """What the candidate's process runs inside."""

    BUBBLEWRAP = "bubblewrap"  # new namespaces, unprivileged uid, read-only binds, rlimits
    NONE = "none"  # an ordinary child process of the verifier: only by explicit request


@dataclass(frozen=True)
class Limits:
    """Resource limits of the candidate's processes (per process, except ``processes``: the
    number of processes and threads in the whole sandbox, and ``memory_bytes``: the memory of the
    whole sandbox tree together, memfds included; each tmpfs has its own ``tmpfs_bytes``)."""

    cpu_seconds: int = 1800
    address_space_bytes: int | None = 32 << 30  # None on CUDA, which reserves far more virtual memory
    file_bytes: int = 256 << 20
    open_files: int = 1024
    processes: int = 256
    tmpfs_bytes: int = 1 << 30
    memory_bytes: int = 8 << 30

    @classmethod
    def for_device(cls, device: str) -> Limits:
        # a CUDA process holds its context and pinned buffers in host memory: a few GiB per rank
        return cls(address_space_bytes=None, memory_bytes=32 << 30) if device == "cuda" else cls()


@dataclass(frozen=True)
class VerifyOptions:
    device: str = "cpu"
    dtypes: tuple[str, ...] = ()
    seed: int | None = None  # None: drawn from OS entropy for this run
    timeout: float = 120.0  # one call (one read or write of the candidate's channel)
    import_timeout: float = 120.0
    #: wall-clock seconds for one op (its sandbox's start to its last reply), and for the whole run
    op_timeout: float = DEFAULT_OP_TIMEOUT
    run_timeout: float = DEFAULT_RUN_TIMEOUT
    graph_replays: int = 3
    keep_going: bool = False
    world_size: int | None = None  # collectives; None means the default of 2
    profile: Profile | None = None
    #: ``module:Class`` of the graph backend; only the CUDA one on a CUDA device is a proof. Tests
    #: inject an emulation to exercise the orchestration on CPU.
    graph_backend: str = CUDA_BACKEND
    confinement: Confinement = Confinement.BUBBLEWRAP
    limits: Limits | None = None  # None: Limits.for_device(device)
    stability_calls: int = 1000
    #: ``[SLOT:]ID`` of one eager case to run alone (an author iterating on a failure); None: all
    case: str | None = None

    @property
    def graph_is_proof(self) -> bool:
        return self.device == "cuda" and self.graph_backend == CUDA_BACKEND

    def resolved_limits(self) -> Limits:
        return self.limits or Limits.for_device(self.device)


def draw_seed() -> int:
    """A fresh 63-bit run seed from OS entropy."""
    return secrets.randbits(63)


class CaseKind(StrEnum):
    REGISTERED = "registered"  # a shape the catalog names
    JITTER = "jitter"  # a registered shape with a nearby token count
    DRAWN = "drawn"  # a token count drawn from the lower half of the serving range, heavy-tailed
    SERVING = "serving"  # the largest token count the pin serves the slot at (a chunk or power of two)
    COUNT = "count"  # another token count the pin serves at (power of two, chunked prefill, CUDA-graph batch)

    @property
    def seeded(self) -> bool:
        """Whether the case's shape comes from the run seed (a registered one is fixed)."""
        return self is not CaseKind.REGISTERED


def case_id(dtype: str, kind: CaseKind, index: int) -> str:
    """``float32/r2``: the dtype, the kind's initial and its index. Stable for a given run seed (a
    drawn shape is drawn from it), so ``--seed S --case ID`` reruns exactly that case."""
    return f"{dtype}/{kind.value[0]}{index}"


def case_kind(case: str) -> CaseKind | None:
    """The kind a case id (``[SLOT:]DTYPE/KI``) names; None when it names none."""
    initial = case.rpartition(":")[2].partition("/")[2][:1]
    return next((kind for kind in CaseKind if kind.value[0] == initial), None)


@dataclass(frozen=True)
class PlannedCase:
    id: str  # case_id(): what --case names
    case: ShapeCase
    kind: CaseKind
    trials: int  # trial 0 fills fresh buffers; later trials refill them with new values
    statistics: Statistics | None = None  # None: the slot's plain initialisation

    def note(self) -> str:
        return "" if self.statistics is None else f"{self.kind.value} {self.statistics.label()}"


def eager_cases(slot: SlotSpec, dtype: str, seed: int) -> list[PlannedCase]:
    """Registered shapes and their jitter first (plain inputs), then, with varied statistics, a
    token count drawn below half of the serving range (heavy-tailed), and the serving counts this
    run asks for (``serving.chosen_counts``): the largest, the smallest and a few drawn."""
    planned: list[PlannedCase] = []
    for i, case in enumerate(slot.shapes):
        planned.append(PlannedCase(case_id(dtype, CaseKind.REGISTERED, i), case, CaseKind.REGISTERED, 2))
        jittered = jitter_case(slot, case, derive_seed(seed, slot.name, "jitter", i))
        planned.append(PlannedCase(case_id(dtype, CaseKind.JITTER, i), jittered, CaseKind.JITTER, 2))
    rng = random.Random(derive_seed(seed, slot.name, dtype, "draws"))
    half = max(1, slot.serving_tokens // 2)
    lower = min(half - 1, int(math.exp(rng.uniform(0.0, math.log(half))))) if half > 1 else 1
    counts = chosen_counts(slot.serving_tokens, random.Random(derive_seed(seed, slot.name, dtype, "counts")))
    drawn = [(max(1, lower), CaseKind.DRAWN, 0, 2, True), (counts[-1], CaseKind.SERVING, 0, 1, None)]
    drawn += [(tokens, CaseKind.COUNT, i, 1, None) for i, tokens in enumerate(counts[:-1])]
    for tokens, kind, index, trials, heavy in drawn:
        base = _base_for(slot, tokens, DRAWN_ELEMENT_BUDGET, rng)
        planned.append(PlannedCase(case_id(dtype, kind, index), with_tokens(slot, base, tokens), kind, trials,
                                   draw_statistics(slot, rng, heavy)))
    return planned


def _base_for(slot: SlotSpec, tokens: int, budget: int, rng: random.Random) -> ShapeCase:
    """A registered case to take the other dims from: any that fits the budget at ``tokens``,
    else the one that ships the fewest elements."""
    fitting = [c for c in slot.shapes if input_elements(slot, with_tokens(slot, c, tokens)) <= budget]
    if fitting:
        return rng.choice(fitting)
    return min(slot.shapes, key=lambda c: input_elements(slot, with_tokens(slot, c, tokens)))


@dataclass(frozen=True)
class StabilitySet:
    """One set of buffers the stability stage keeps in the child and refills many times."""

    key: int
    dtype: str
    case: ShapeCase


@dataclass(frozen=True)
class StabilityCall:
    """One call; every one is judged (a sampled share let a kernel wrong once in a while pass)."""

    key: int  # which set
    refill: bool  # False for the set's first call (fresh buffers, prepare), True after
    seed: int


@dataclass(frozen=True)
class StabilityPlan:
    sets: tuple[StabilitySet, ...]
    calls: tuple[StabilityCall, ...]


def stability_plan(slot: SlotSpec, dtypes: list[str], seed: int, calls: int) -> StabilityPlan:
    """Small sets (every dtype × the registered cases that stay CPU-sized at a few tokens), then
    ``calls`` calls interleaved across them in random order, each with fresh inputs."""
    rng = random.Random(derive_seed(seed, slot.name, "stability"))
    cases = [c for c in slot.shapes
             if input_elements(slot, with_tokens(slot, c, STABILITY_MAX_TOKENS)) <= STABILITY_ELEMENT_BUDGET]
    if not cases:
        cases = [min(slot.shapes, key=lambda c: input_elements(slot, with_tokens(slot, c, 1)))]
    sets = tuple(
        StabilitySet(i, dtype, with_tokens(slot, case, rng.randint(1, STABILITY_MAX_TOKENS)))
        for i, (dtype, case) in enumerate((d, c) for d in dtypes for c in cases)
    )
    order = [s.key for s in sets] + [rng.randrange(len(sets)) for _ in range(max(0, calls - len(sets)))]
    rng.shuffle(order)
    seen: set[int] = set()
    planned = []
    for key in order:
        planned.append(StabilityCall(key, key in seen, rng.getrandbits(63)))
        seen.add(key)
    return StabilityPlan(sets, tuple(planned))
