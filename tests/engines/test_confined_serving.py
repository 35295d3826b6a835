"""The activation proof and a gateway check against confined servers (``cacheon.serving.confined``).

The pin at page size 1, as tests/engines/test_activation_seam.py runs it, but each armed server runs
inside the verify sandbox: the faithful bundle must reproduce the stock (unarmed, the pool's) greedy
token ids exactly, the broken one must change them, and the receipts must come from the sandbox's
scheduler process. The record goes into a ledger as ``cpu_serving_activation`` and names the
confinement. Then the tier's gateway check (tests/engines/test_real_gateway.py: OpenAI client through
``cacheon gateway serve``, KV events, exact predictions, hash attestation to READY) runs with the
confined faithful server as its only worker.
"""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from cacheon.bundle.admission import admit
from cacheon.evidence.classes import EvidenceClass, Outcome, seam_subject
from cacheon.evidence.ledger import Entry, Ledger, open_verified_ledger
from cacheon.runtime.receipts import read_receipts
from cacheon.sim.launch import GatewayProcess
from tests.engines import activation_proof as proof
from tests.engines import confined
from tests.engines import test_real_gateway as gateway_tier
from tests.engines.conftest import serve
from tests.engines.server import SERVED_MODEL_NAME, EngineServer, EngineSpec
from tests.engines.test_activation_seam import server_identity

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PIN = "0.5.13.post1"
PAGE_SIZE = 1


def _outputs(server: EngineServer) -> list[list[int]]:
    sampling = {"temperature": 0, "max_new_tokens": proof.MAX_NEW_TOKENS, "ignore_eos": True}
    return [server.post("/generate", {"text": text, "sampling_params": sampling})["output_ids"] for text in proof.PROMPTS]


def _arm(engine: confined.ConfinedEngine, name: str) -> proof.Arm:
    launcher = confined.namespace_pids(engine, "-m sglang.launch_server")
    return proof.Arm(name, _outputs(engine), read_receipts(engine.receipt_dir),
                     confined.namespace_pids(engine, "scheduler"), next(iter(launcher), None))


@pytest.fixture(scope="module")
def faithful(engine_pool, tmp_path_factory):
    engine = confined.start(engine_pool, EngineSpec(PIN, PAGE_SIZE, "llama", proof.FAITHFUL),
                            tmp_path_factory.mktemp("confined-faithful"))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def activation(engine_pool, faithful, tmp_path_factory):
    stock = serve(engine_pool, EngineSpec(PIN, PAGE_SIZE))
    arms = {"unarmed": proof.Arm("unarmed", _outputs(stock), read_receipts(stock.receipt_dir)),
            "faithful": _arm(faithful, "faithful")}
    broken = confined.start(engine_pool, EngineSpec(PIN, PAGE_SIZE, "llama", proof.BROKEN),
                            tmp_path_factory.mktemp("confined-broken"))
    try:
        arms["broken"] = _arm(broken, "broken")
        broken_confinement = broken.confined.describe()
    finally:
        broken.close()
    verdict = proof.judge(arms)
    identity = server_identity(PIN)
    details = {
        **verdict.details(),
        "what": "real SGLang server on CPU (tiny random model, named stand-ins), armed servers confined; "
                "not GPU, not complete-engine",
        "seam": proof.SEAM,
        "confinement": {"faithful": faithful.confined.describe(), "broken": broken_confinement,
                        "unarmed": "stock reference, unconfined, no bundle"},
        "bundles": {name: admit(path).digest for name, path in proof.ARMS.items() if path is not None},
        "prompts": list(proof.PROMPTS),
        "max_new_tokens": proof.MAX_NEW_TOKENS,
        "page_size": PAGE_SIZE,
        "receipts": {name: arm.fired() for name, arm in arms.items()},
    }
    entry = Entry(EvidenceClass.CPU_SERVING_ACTIVATION, seam_subject(proof.SEAM), identity,
                  Outcome.PASS if verdict.passed else Outcome.FAIL, details)
    ledger_path = tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"
    with Ledger.open(ledger_path) as ledger:
        record_id = ledger.append(entry)
    return arms, verdict, ledger_path, record_id


def test_the_confined_faithful_bundle_reproduces_the_stock_server_and_the_broken_one_does_not(activation) -> None:
    arms, verdict, *_ = activation
    assert arms["faithful"].outputs == arms["unarmed"].outputs
    assert verdict.changed_prompts >= len(proof.PROMPTS) - 1, verdict.details()
    assert verdict.passed, verdict.problems


def test_the_seam_fired_in_the_sandboxed_scheduler_not_its_launcher(activation) -> None:
    arms, *_ = activation
    for name in ("faithful", "broken"):
        arm = arms[name]
        assert arm.scheduler_pids and arm.launcher_pid is not None
        fired = {r["pid"] for r in arm.fired()}
        assert fired and fired <= arm.scheduler_pids and arm.launcher_pid not in fired, (name, arm.receipts)


def test_the_evidence_record_names_the_confinement(activation) -> None:
    _, _, ledger_path, record_id = activation
    record = open_verified_ledger(ledger_path).record(record_id)
    assert (record.evidence_class, record.outcome) == ("cpu_serving_activation", "pass")
    for arm in ("faithful", "broken"):
        described = record.details["confinement"][arm]
        assert described["confinement"] == "bubblewrap"
        assert {"user", "pid", "net", "mount"} <= set(described["namespaces"])
        assert described["network"]["inside"] == "loopback only"


def test_the_gateway_in_front_of_a_confined_worker_routes_predicts_and_attests(faithful, tmp_path_factory) -> None:
    """tests/engines/test_real_gateway.py's OpenAI-client check, the confined server its only worker."""
    model_dir = faithful.model["path"]
    with ExitStack() as stack:
        gw = GatewayProcess(stack, tmp_path_factory.mktemp("gateway"), None, "exact", [{"url": faithful.url}],
                            models={SERVED_MODEL_NAME: {"tokenizer": model_dir}}, health_interval_s=1.0,
                            challenge_timeout_s=20, request_timeout_s=120)
        status = gw.settled([faithful.url])[faithful.url]
        assert (status["version"], status["ladder"]["state"]) == (PIN, "READY"), status
        assert status["subscribed"] and status["indexed_blocks"] > 0
        assert status["kv_replay_port"] == faithful.confined.request.ports.replay
        fleet = gateway_tier.Fleet({PIN: faithful}, {"both": gw})
        gateway_tier.test_the_openai_client_routes_by_prefix_and_streams_with_exact_predictions(fleet)
