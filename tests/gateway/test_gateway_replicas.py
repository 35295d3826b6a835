"""Several gateway replicas on the same workers: each subscribes to every publisher, so their indexes are
independent and must be identical; a restarted replica converges again through replay."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cacheon.sim.launch import GatewayProcess, SimProcess, wait_until
from tests.gateway.agreement import agreed, digests

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # workers and three gateways as processes

DOCS = ["The radix cache keeps every prefix it has seen until memory runs short. ",
        "Replicas of a router must agree on what each worker holds. "]


def drive(replicas: list[GatewayProcess], n: int, start: int) -> None:
    """Shared-prefix chats, alternating over the replicas, a few at a time."""
    def ask(i: int) -> None:
        gw = replicas[i % len(replicas)]
        messages = [{"role": "system", "content": DOCS[i % 2] * 6}, {"role": "user", "content": f"question {i}"}]
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "demo", "messages": messages,
                                                              "max_tokens": 2}, timeout=30)
        assert r.status_code == 200, r.text

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(ask, range(start, start + n)))


def test_replicas_agree_and_a_restarted_one_converges(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp_path, profile, v, replay=True) for v in ("0.5.23", "0.5.13.post1")]
        for s in sims:
            s.ready()
        urls = [s.url for s in sims]
        workers = [{"url": u} for u in urls]
        replicas = [GatewayProcess(stack, tmp_path, profile, "exact", workers) for _ in range(3)]
        for gw in replicas:
            assert {w["ladder"]["state"] for w in gw.settled(urls).values()} == {"READY"}
        drive(replicas, 24, 0)
        before = wait_until(lambda: agreed(replicas, urls), f"the replicas to agree: {digests(replicas, urls)}", 30)

        # One replica dies; the others go on and see traffic it misses; it comes back empty.
        replicas[2].proc.kill()
        replicas[2].proc.wait(10)
        drive(replicas[:2], 12, 24)
        replicas[2] = GatewayProcess(stack, tmp_path, profile, "exact", workers)
        replicas[2].settled(urls)
        after = wait_until(lambda: agreed(replicas, urls), f"the restarted replica to converge: "
                           f"{digests(replicas, urls)}", 30)
        assert after != before  # converged on the new state, not the old one
        assert all(replicas[2].status()[u]["last_seq"] for u in urls)

        # The same digests as a metric, for an alert on replicas that disagree.
        gauges = []
        for gw in replicas:
            text = httpx.get(f"{gw.url}/metrics", timeout=10).text
            (family,) = [f for f in text_string_to_metric_families(text) if f.name == "cacheon_index_digest"]
            gauges.append({s.labels["worker"]: s.value for s in family.samples})
        assert gauges[0] == gauges[1] == gauges[2] and len(gauges[0]) == 2
