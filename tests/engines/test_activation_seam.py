"""Seam activation in a live server at the pin, on CPU: the seed's behavioural proof.

A real SGLang 0.5.13.post1 server (``python -m sglang.launch_server`` from its server venv, a tiny
random Llama, page size 1) is booted three times: unarmed, armed with a faithful ``silu_and_mul``
bundle and armed with a broken one, through the Cacheon plugin (the ``sglang.srt.plugins`` entry
point). The outcome goes into an evidence ledger under the runtime identity of that server's venv,
as ``cpu_serving_activation``: a CPU serving activation proof, never GPU or complete-engine evidence.
Set ``CACHEON_ENGINE_EVIDENCE_LEDGER`` to also append the record to that ledger. (Named to run before
test_hash_parity.py, whose first server is this module's unarmed one: the pool starts it once.)
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest

from cacheon.bundle.admission import admit
from cacheon.evidence.classes import EvidenceClass, Outcome, seam_subject
from cacheon.evidence.ledger import Entry, Ledger
from cacheon.runtime.identity import identity_from_facts
from cacheon.runtime.receipts import read_receipts
from tests.engines import activation_proof as proof
from tests.engines.conftest import serve
from tests.engines.server import EngineServer, EngineSpec, venv_python

PIN = "0.5.13.post1"
PAGE_SIZE = 1
LEDGER_ENV = "CACHEON_ENGINE_EVIDENCE_LEDGER"


def _spec(bundle: Path | None) -> EngineSpec:
    return EngineSpec(PIN, PAGE_SIZE, "llama", bundle)


def _scheduler_pids(server: EngineServer) -> set[int]:
    children = psutil.Process(server.process.pid).children(recursive=True)
    return {p.pid for p in children if "scheduler" in " ".join(p.cmdline() or [p.name()])}


def _boot(pool, name: str, bundle: Path | None) -> proof.Arm:
    server = serve(pool, _spec(bundle))
    outputs = [
        server.post(
            "/generate",
            {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": proof.MAX_NEW_TOKENS, "ignore_eos": True}},
        )["output_ids"]
        for text in proof.PROMPTS
    ]
    arm = proof.Arm(name, outputs, read_receipts(server.receipt_dir), _scheduler_pids(server), server.process.pid)
    if bundle is not None:
        pool.release(_spec(bundle))  # an armed server serves no other test
    return arm


def server_identity(release: str):
    """The runtime identity of the server venv (captured by its own interpreter, where it runs)."""
    code = "import json; from cacheon.runtime.identity import capture_environment; print(json.dumps(capture_environment()))"
    done = subprocess.run([str(venv_python(release)), "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return identity_from_facts(json.loads(done.stdout))


@pytest.fixture(scope="module")
def activation(engine_pool, tmp_path_factory):
    arms = {name: _boot(engine_pool, name, bundle) for name, bundle in proof.ARMS.items()}
    verdict = proof.judge(arms)
    identity = server_identity(PIN)
    unarmed = engine_pool.get(_spec(None))
    details = {
        **verdict.details(),
        "what": "real SGLang server on CPU (tiny random model, named stand-ins); not GPU, not complete-engine",
        "seam": proof.SEAM,
        "bundles": {name: admit(path).digest for name, path in proof.ARMS.items() if path is not None},
        "prompts": list(proof.PROMPTS),
        "max_new_tokens": proof.MAX_NEW_TOKENS,
        "page_size": PAGE_SIZE,
        "model": {k: unarmed.model[k] for k in ("family", "architecture", "vocab_size", "seed")},
        "server_env": unarmed.env,
        "receipts": {name: arm.fired() for name, arm in arms.items()},
    }
    entry = Entry(
        EvidenceClass.CPU_SERVING_ACTIVATION,
        seam_subject(proof.SEAM),
        identity,
        Outcome.PASS if verdict.passed else Outcome.FAIL,
        details,
    )
    ledger_path = tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"
    with Ledger.open(ledger_path) as ledger:
        record_id = ledger.append(entry)
    if os.environ.get(LEDGER_ENV):
        with Ledger.open(Path(os.environ[LEDGER_ENV])) as ledger:
            ledger.append(entry)
    return arms, verdict, identity, ledger_path, record_id


def test_the_faithful_bundle_reproduces_the_unarmed_server_exactly(activation) -> None:
    arms, *_ = activation
    assert arms["faithful"].outputs == arms["unarmed"].outputs
    assert all(len(ids) == proof.MAX_NEW_TOKENS for ids in arms["unarmed"].outputs)


def test_the_broken_bundle_changes_the_completions(activation) -> None:
    _, verdict, *_ = activation
    # A kernel that drops the SiLU must not slip through on most prompts, not merely on one.
    assert verdict.changed_prompts >= len(proof.PROMPTS) - 1, verdict.details()


def test_the_adapter_fired_in_the_scheduler_process_not_the_launcher(activation) -> None:
    arms, verdict, *_ = activation
    assert verdict.passed, verdict.problems
    for name in ("faithful", "broken"):
        arm = arms[name]
        fired = arm.fired()
        assert fired and {r["pid"] for r in fired} <= arm.scheduler_pids, (name, arm.receipts, arm.scheduler_pids)
    assert not arms["unarmed"].receipts


def test_the_proof_is_recorded_as_cpu_serving_activation_under_the_server_identity(activation) -> None:
    _, _, identity, ledger_path, record_id = activation
    with Ledger.open(ledger_path, create=False) as ledger:
        record = ledger.verified().record(record_id)
    assert record.evidence_class == "cpu_serving_activation"
    assert record.outcome == "pass"
    assert record.identity_digest == identity.digest
    assert identity.sglang_version == PIN
    assert identity.gpu_count == 0
    # The identity names the stand-ins the server ran with: never mistaken for the engine image.
    assert {"name": "torchvision", "version": "0.0.0+cacheon.standin"} in identity.facts["standins"]
    assert "not GPU" in record.details["what"]
