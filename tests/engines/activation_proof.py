"""The seam-activation proof, shared by every tier that boots a real server three times.

Unarmed, with a faithful ``silu_and_mul`` bundle, with a broken one (``$CACHEON_BUNDLE`` arms it through
the ``sglang.srt.plugins`` entry point). Greedy completions on fixed prompts: the faithful arm must
reproduce the unarmed token ids exactly, the broken arm must change them, and receipts must come from
the scheduler processes (where the model runs), not only the launcher. Several prompts and enough
tokens, because with a tiny random model one short completion can survive a wrong kernel.
The CPU tier (tests/engines/test_activation_seam.py) and the GPU image tier
(tests/live/test_seam_activation_live.py) differ only in how they start a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.runtime.sglang_tier import EXAMPLES

SEAM = "activation.SiluAndMul"
FAITHFUL, BROKEN = EXAMPLES / "silu-torch", EXAMPLES / "silu-broken-no-silu"
ARMS = {"unarmed": None, "faithful": FAITHFUL, "broken": BROKEN}
MAX_NEW_TOKENS = 32
PROMPTS = (
    "The capital of France is Paris. The capital of Japan is",
    "Bread needs four things: flour, water, salt and",
    "A mechanical clock stores energy in a spring or a weight and",
    "def greet(name: str, times: int = 1) -> str:",
    "The fishing boats leave the harbour before the sun is up, and",
    "There are 24 hours in a day, 60 minutes in an hour and",
)


@dataclass
class Arm:
    """What one boot produced: greedy token ids per prompt, receipts, and the processes it ran in."""

    name: str
    outputs: list[list[int]]
    receipts: list[dict[str, Any]]
    scheduler_pids: set[int] | None = None  # None where the tier cannot see them (a container)
    launcher_pid: int | None = None

    def fired(self) -> list[dict[str, Any]]:
        return [r for r in self.receipts if r["seam"] == SEAM and r["fired"] > 0]


@dataclass
class Verdict:
    passed: bool
    problems: list[str] = field(default_factory=list)
    changed_prompts: int = 0

    def details(self) -> dict[str, Any]:
        return {"passed": self.passed, "problems": self.problems, "changed_prompts": self.changed_prompts}


def judge(arms: dict[str, Arm], *, min_ranks: int = 1) -> Verdict:
    """Every condition of the proof, each failure named."""
    unarmed, faithful, broken = arms["unarmed"], arms["faithful"], arms["broken"]
    problems = []
    if faithful.outputs != unarmed.outputs:
        differing = [i for i, (a, b) in enumerate(zip(unarmed.outputs, faithful.outputs, strict=True)) if a != b]
        problems.append(f"the faithful bundle changed the completion of prompt(s) {differing}")
    changed = sum(a != b for a, b in zip(unarmed.outputs, broken.outputs, strict=True))
    if changed == 0:
        problems.append("the broken bundle changed no completion: the seam did not fire in the model's process")
    if unarmed.receipts:
        problems.append(f"the unarmed server left receipts: {unarmed.receipts}")
    for arm in (faithful, broken):
        fired = arm.fired()
        pids = {r["pid"] for r in fired}
        if len(pids) < min_ranks:
            problems.append(f"{arm.name}: receipts from {len(pids)} process(es), expected {min_ranks}: {arm.receipts}")
        if arm.scheduler_pids is not None and not pids <= arm.scheduler_pids:
            problems.append(f"{arm.name}: receipts from {pids}, not the scheduler process(es) {arm.scheduler_pids}")
        if arm.launcher_pid is not None and arm.launcher_pid in pids:
            problems.append(f"{arm.name}: the launcher process served the bundle, not a scheduler")
    return Verdict(not problems, problems, changed)
