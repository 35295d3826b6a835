"""Each rung of the attestation ladder, failed through the simulator's fault switch for it."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from cacheon.sim.launch import GatewayProcess, SimProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: workers and a gateway as processes

# fault switch -> the reason the ladder must report
EXPECTED = {
    "version_lie": "identity_mismatch",
    "geometry_lie": "engine_geometry_mismatch",
    "tokenize_500": "probe_schema_mismatch",
    "tokenize_drift": "token_mismatch",
    "no_echo": "challenge_timeout",
    "wrong_echo": "challenge_failed",
    "rank_lie": "challenge_failed",
    "wire_lie": "contract_reject",  # claims 0.5.13.post1, publishes 0.5.20's tagged maps
}


def test_every_ladder_failure_is_reached_and_fenced(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        sims = {f: SimProcess(stack, tmp_path, profile, "0.5.20", dp_size=2 if f == "rank_lie" else 1, fault=f)
                for f in EXPECTED}
        good = SimProcess(stack, tmp_path, profile, "0.5.20", dp_size=2, replay=True)
        misconfigured = SimProcess(stack, tmp_path, profile, "0.5.20", replay=True)
        for s in [*sims.values(), good, misconfigured]:
            s.ready()
        # Geometry given explicitly is checked against what each worker reports.
        workers = [{"url": s.url, "page_size": 4, "kv_port": s.kv_port} for s in [*sims.values(), good]]
        workers.append({"url": misconfigured.url, "kv_replay_port": misconfigured.replay_port + 7})
        gw = GatewayProcess(stack, tmp_path, profile, "exact", workers, challenge_timeout_s=4)
        status = gw.settled([s.url for s in [*sims.values(), good, misconfigured]])
        assert status[good.url]["ladder"]["state"] == "READY", status[good.url]
        # The replay port comes from the worker's own --kv-events-config; a configured one must agree.
        assert status[good.url]["kv_replay_port"] == good.replay_port
        assert status[misconfigured.url]["ladder"]["reason"] == "engine_geometry_mismatch"
        assert "KV replay port base" in status[misconfigured.url]["ladder"]["detail"]
        got = {f: (status[s.url]["ladder"]["state"], status[s.url]["ladder"]["reason"]) for f, s in sims.items()}
        assert got == {f: ("FENCED", reason) for f, reason in EXPECTED.items()}

        # Fenced workers take no exact decisions: a warm prefix only ever hits the good worker.
        prompt = "Routing by prefix keeps the KV cache hot across turns of a conversation. " * 3
        hits: list[str] = []

        def hit() -> bool:
            r = httpx.post(f"{gw.url}/v1/completions", json={"model": "demo", "prompt": prompt, "max_tokens": 1})
            assert r.status_code == 200
            if r.headers["x-cacheon-route"] == "exact:prefix_hit":
                hits.append(r.headers["x-cacheon-worker"])
            return len(hits) >= 3

        wait_until(hit, "prefix hits", 20)
        assert set(hits) == {good.url}


def test_a_restarted_worker_is_fenced_and_attested_again(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        # Page size 1 (SGLang's default on CUDA): the challenge's pages repeat tokens, matched by position.
        first = SimProcess(stack, tmp_path, profile, "0.5.21", page_size=1)
        first.ready()
        # A climb that meets the new process half up (HTTP answering, its publisher not yet bound) fences
        # it until the retry: short here, so a loaded machine's slow start-up does not outlast the wait.
        gw = GatewayProcess(stack, tmp_path, profile, "exact", [{"url": first.url}], attest_retry_s=2)
        before = gw.settled([first.url])[first.url]["ladder"]
        assert before["state"] == "READY"
        first.proc.kill()
        first.proc.wait(10)
        # A new process on the same ports: its KV sequence starts over and its cache is empty.
        again = SimProcess(stack, tmp_path, profile, "0.5.21", page_size=1, ports=(first.port, first.kv_port))
        again.ready()

        def reattested() -> dict | None:
            ladder = gw.status()[first.url]["ladder"]
            return ladder if ladder["state"] == "READY" and ladder["attested_at"] > before["attested_at"] else None

        wait_until(reattested, "re-attestation after the restart", 30)
