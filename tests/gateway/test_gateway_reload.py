"""Config reload on a real ``cacheon gateway serve`` process: SIGHUP and ``POST /config/reload`` read the
file again, validate it whole first, keep the running config on any error, and say what changed."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cacheon.sim.launch import GatewayProcess, wait_until
from tests.gateway.inproc import LoopThread, Recorder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # a gateway process
JSON = {"content-type": "application/json"}


@pytest.fixture
def recorders() -> Iterator[tuple[Recorder, Recorder]]:
    loop = LoopThread()
    a, b = Recorder(loop), Recorder(loop)
    yield a, b
    a.close()
    b.close()
    loop.close()


def _rewrite(gw: GatewayProcess, **changes: Any) -> None:
    cfg = yaml.safe_load(gw.config.read_text())
    gw.config.write_text(yaml.safe_dump({**cfg, **changes}))


def _ids(gw: GatewayProcess) -> list[str]:
    return sorted(w["id"] for w in httpx.get(f"{gw.admin_url}/status", timeout=5).json()["workers"])


def _reload(gw: GatewayProcess) -> httpx.Response:
    return httpx.post(f"{gw.admin_url}/config/reload", headers=JSON, timeout=30)


def _complete(gw: GatewayProcess) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1}, timeout=10)


def _logged(gw: GatewayProcess, text: str) -> bool:
    return text in gw.log.read_text()


def test_sighup_and_the_admin_route_reload_what_they_can_and_keep_the_rest(
        recorders: tuple[Recorder, Recorder], tmp_path: Path) -> None:
    a, b = recorders
    with ExitStack() as stack:
        gw = GatewayProcess(stack, tmp_path, None, "rr", [{"url": a.url, "id": "a"}])
        assert _ids(gw) == ["a"]

        # SIGHUP with a good file: b replaces a, the new health cadence applies, the log says what changed.
        _rewrite(gw, workers=[{"url": b.url, "id": "b"}], health_interval_s=0.3)
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: _ids(gw) == ["b"], "b to replace a", 20)
        wait_until(lambda: _logged(gw, "reloaded: workers, health_interval_s"), "the reload's log line", 10)
        assert gw.proc.poll() is None and _complete(gw).headers["x-cacheon-worker"] == b.url

        # SIGHUP with a broken file: still serving, nothing changed, the log says why.
        good = gw.config.read_text()
        gw.config.write_text(good + "policy: fastest\n")
        gw.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: _logged(gw, "not reloaded, the running config is kept: policy: invalid enum value"),
                   "the refusal's log line", 10)
        assert gw.proc.poll() is None and _ids(gw) == ["b"] and _complete(gw).status_code == 200

        # The admin route: refusals name the problem and apply nothing, even the keys that could change.
        for changes, message in [
            ({"listen": "127.0.0.1:1", "health_interval_s": 1.0}, "listen: fixed at start, restart the gateway"),
            ({"workers": [{"url": b.url, "id": "b"}, {"url": gw.url}]}, "workers[1]: " + gw.url
             + " is this gateway's own listener"),
            ({"workers": [{"url": b.url, "id": "b"}, {"url": b.url.replace("127.0.0.1", "localhost")}]},
             "under another name"),
            ({"workers": [{"url": "http://w:99999"}]}, "workers[0].url: 'http://w:99999' is not http(s)://HOST:PORT"),
        ]:
            gw.config.write_text(good)
            _rewrite(gw, **changes)
            r = _reload(gw)
            assert r.status_code == 400 and r.json()["error"]["code"] == "config_rejected", r.text
            assert r.json()["error"]["message"].startswith("config not reloaded, the running config is kept: ")
            assert message in r.json()["error"]["message"], r.text
            assert _ids(gw) == ["b"]

        gw.config.unlink()  # mid-edit, or moved away
        r = _reload(gw)
        assert r.status_code == 400 and f"cannot read config {gw.config}" in r.json()["error"]["message"], r.text
        gw.config.write_text(good)
        _rewrite(gw, workers=[{"url": b.url, "id": "b"}, {"url": a.url, "id": "a"}])
        r = _reload(gw)
        assert r.status_code == 200 and r.json() == {"reloaded": True, "changed": ["workers"],
                                                     "workers_added": ["a"], "workers_removed": []}, r.text
        assert _ids(gw) == ["a", "b"]
        assert _reload(gw).json() == {"reloaded": True, "changed": [], "workers_added": [], "workers_removed": []}

        # The file's diff is what a reload applies: a worker the admin API removed is not brought back by a
        # reload that changed something else.
        assert httpx.delete(f"{gw.admin_url}/workers/a", timeout=30).status_code == 200
        _rewrite(gw, health_interval_s=0.4)
        assert _reload(gw).json() == {"reloaded": True, "changed": ["health_interval_s"], "workers_added": [],
                                      "workers_removed": []}
        assert _ids(gw) == ["b"]
