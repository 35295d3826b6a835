"""Failing, slow and departing workers behind a live gateway: retries, the breaker, timeouts, draining."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from cacheon.sim.launch import GatewayProcess, SimProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: workers and a gateway as processes


def _complete(url: str, prompt: str, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": "demo", "prompt": prompt, "max_tokens": 1},
                      timeout=timeout)


def test_a_failing_worker_is_retried_around_then_broken_off(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        bad, good = SimProcess(stack, tmp_path, profile, "0.5.23", fault="generate_500"), SimProcess(stack, tmp_path, profile,
                                                                                        "0.5.23")
        for s in (bad, good):
            s.ready()
        # The bad worker's /health is fine: only its generations fail, so only the breaker can stop it.
        gw = GatewayProcess(stack, tmp_path, profile, "rr", [{"url": bad.url}, {"url": good.url}],
                     breaker_failures=2, breaker_open_s=60)
        routes = []
        for i in range(6):
            r = _complete(gw.url, f"request {i}")
            assert r.status_code == 200 and r.headers["x-cacheon-worker"] == good.url, r.text
            routes.append(r.headers["x-cacheon-route"])
        # Round robin sends requests 0 and 2 to the bad worker (retried on the good one); two failures
        # open its breaker, so requests 3 to 5 see only the good worker.
        assert routes == ["rr:retry", "rr:round_robin", "rr:retry", "rr:round_robin", "rr:round_robin",
                          "rr:round_robin"]
        status = gw.status()
        assert status[bad.url]["breaker_open"] and not status[good.url]["breaker_open"]
        assert f'cacheon_upstream_errors_total{{worker="{status[bad.url]["id"]}"}} 2.0' in httpx.get(
            f"{gw.url}/metrics").text

        # With nobody left to try, the worker's own 5xx is the answer, unchanged.
        alone = GatewayProcess(stack, tmp_path, profile, "rr", [{"url": bad.url}], breaker_failures=5)
        r = _complete(alone.url, "nobody else")
        assert r.status_code == 500 and r.json()["message"] == "simulated engine failure"
        assert r.headers["x-cacheon-worker"] == bad.url


def test_a_slow_worker_times_out_and_the_client_hears_why(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        slow = SimProcess(stack, tmp_path, profile, "0.5.23", delay_ms=5000)
        slow.ready()
        gw = GatewayProcess(stack, tmp_path, profile, "rr", [{"url": slow.url}], request_timeout_s=1)
        started = time.monotonic()
        r = _complete(gw.url, "too slow")
        assert time.monotonic() - started < 4  # the gateway's 1 s, not the worker's 5 s
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        assert "no answer within 1 s" in r.json()["error"]["message"]
        wait_until(lambda: slow.stats()["aborted"] == 1, "the worker to abort the timed-out request", 10)


def test_removing_a_worker_lets_its_in_flight_requests_finish(tmp_path: Path, profile: tuple[Path, Path]) -> None:
    with ExitStack() as stack:
        sim = SimProcess(stack, tmp_path, profile, "0.5.23", delay_ms=2500)
        sim.ready()
        gw = GatewayProcess(stack, tmp_path, profile, "rr", [{"url": sim.url}])
        answers: list[httpx.Response] = []
        asking = threading.Thread(target=lambda: answers.append(_complete(gw.url, "in flight")))
        asking.start()
        status = wait_until(lambda: (s := gw.status())[sim.url]["in_flight"] == 1 and s, "the request in flight", 10)
        started = time.monotonic()
        removed = httpx.delete(f"{gw.admin_url}/workers/{status[sim.url]['id']}", timeout=30)
        assert removed.status_code == 200 and removed.json()["in_flight_left"] == 0
        assert time.monotonic() - started > 1  # it waited for the request rather than cutting it off
        asking.join(10)
        stats = sim.stats()
        assert answers and answers[0].status_code == 200 and (stats["completed"], stats["aborted"]) == (1, 0)
        assert sim.url not in gw.status()
