"""A worker killed mid-run: no in-flight non-streamed request is lost, and it gets no new ones."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from cacheon.sim.launch import GatewayProcess, SimProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: workers and a gateway as processes


def test_killed_worker_loses_no_in_flight_request(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        survivor, victim = (SimProcess(stack, tmp_path, profile, "0.5.23", delay_ms=5000) for _ in range(2))
        for s in (survivor, victim):
            s.ready()
        gw = GatewayProcess(stack, tmp_path, profile, "rr", [{"url": survivor.url}, {"url": victim.url}])
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", timeout=60, max_retries=0)
        started = threading.Barrier(17)

        def ask(i: int) -> str:
            started.wait(timeout=30)
            raw = client.completions.with_raw_response.create(model="demo", prompt=f"request {i}", max_tokens=2)
            assert raw.parse().choices[0].text
            return raw.headers["x-cacheon-worker"]

        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(ask, i) for i in range(16)]
            started.wait(timeout=30)
            # Requests are in flight on both workers (each takes 5 s) when the victim dies.
            wait_until(lambda: all(w["in_flight"] > 0 for w in gw.status().values()), "load on both workers", 10)
            victim.proc.kill()
            served = [f.result(timeout=60) for f in futures]
        assert served.count(survivor.url) == 16  # the victim's in-flight ones were retried there

        # Once its health check fails it is routed to no more (not merely retried away from).
        wait_until(lambda: not gw.status()[victim.url]["healthy"], "the victim's health check to fail", 20)

        def after(i: int) -> tuple[str, str]:
            raw = client.completions.with_raw_response.create(model="demo", prompt=f"after {i}", max_tokens=1)
            return raw.headers["x-cacheon-worker"], raw.headers["x-cacheon-route"]

        with ThreadPoolExecutor(4) as pool:
            assert set(pool.map(after, range(4))) == {(survivor.url, "rr:round_robin")}



def test_a_client_that_leaves_aborts_its_upstream_request(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        sim = SimProcess(stack, tmp_path, profile, "0.5.23", delay_ms=4000)
        sim.ready()
        gw = GatewayProcess(stack, tmp_path, profile, "rr", [{"url": sim.url}])
        body = {"model": "demo", "prompt": "never mind", "max_tokens": 40, "stream": True}
        # Streamed: 40 chunks over 4 s; the client reads the first one and hangs up.
        with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            assert next(r.iter_lines()).startswith("data: ")
        left = time.monotonic()
        wait_until(lambda: sim.stats()["aborted"] == 1, "the worker to abort the streamed request", 10)
        assert time.monotonic() - left < 3  # long before the stream's natural end
        assert gw.status()[sim.url]["in_flight"] == 0

        # Not streamed: the client times out; the gateway cancels, and the worker aborts too.
        impatient = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", timeout=0.5, max_retries=0)
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(model="demo", prompt="never mind", max_tokens=1)
        left = time.monotonic()
        wait_until(lambda: sim.stats()["aborted"] == 2, "the worker to abort the non-streamed request", 10)
        assert time.monotonic() - left < 3
        assert gw.status()[sim.url]["in_flight"] == 0 and sim.stats()["completed"] == 0
