"""``cacheon kv relay``: a config mistake is one line; a running relay follows its worker and says so on exit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import yaml

from cacheon.sim.launch import SimProcess


def _relay(config: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cacheon", "kv", "relay", "--config", str(config), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_config_mistake_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "relay.yaml"
    config.write_text(yaml.safe_dump({"event_plane": {"url": "http://nats:4222"}, "workers": []}))
    proc = _relay(config)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err  # a usage error (cli.py)
    assert "Traceback" not in err and "nats://HOST:PORT" in err and len(err.strip().splitlines()) == 1


def test_a_relay_refuses_the_gateway_only_kv_events_setting(tmp_path: Path) -> None:
    config = tmp_path / "relay.yaml"
    config.write_text(yaml.safe_dump({"event_plane": {"url": "nats://127.0.0.1:1", "kv_events": "workers"},
                                      "workers": []}))
    proc = _relay(config)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "a relay publishes KV events" in err and len(err.strip().splitlines()) == 1, err


def test_an_unreachable_event_plane_is_one_line_not_a_hang(tmp_path: Path) -> None:
    config = tmp_path / "relay.yaml"
    config.write_text(yaml.safe_dump({"event_plane": {"url": "nats://127.0.0.1:1"}, "workers": []}))
    proc = _relay(config)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "no server answered" in err and len(err.strip().splitlines()) == 1, err


def test_the_relay_follows_its_worker_until_sigterm(tmp_path: Path, profile, nats_shared, plane_names) -> None:
    with ExitStack() as stack:
        sim = SimProcess(stack, tmp_path, profile, "0.5.23")
        sim.ready()
        config = tmp_path / "relay.yaml"
        config.write_text(yaml.safe_dump({"event_plane": {"url": nats_shared.url, **plane_names},
                                          "workers": [{"url": sim.url, "id": "sim-a"}], "relay_id": "cli"}))
        proc = _relay(config, "--json")
        stack.callback(proc.kill)
        time.sleep(3)  # connect, take the lease, follow
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        status = json.loads(out)
        assert status["relay"] == "cli" and "relay follows worker" in err
        assert status["workers"]["sim-a"]["published"] >= 1  # at least its reset: a new epoch
