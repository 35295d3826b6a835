"""The event plane's manifests agree with the code: the relay config decodes, the relay runs a command the
CLI has, and its NATS URL names the NATS Service's port."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import yaml

from cacheon.cli import build_parser
from cacheon.gateway.config import RelayConfig
from tests.gateway.test_gateway_deploy import manifests


def test_the_relay_manifest_runs_a_valid_config_against_the_nats_service() -> None:
    m = manifests()
    cfg = msgspec.convert(yaml.safe_load(m["ConfigMap/cacheon-relay"]["data"]["relay.yaml"]), RelayConfig)
    container = m["Deployment/cacheon-relay"]["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[0] == "cacheon"
    args = build_parser(command[1]).parse_args([*command[1:], *container["args"]])
    assert args.config == Path(container["volumeMounts"][0]["mountPath"])
    url = urlsplit(cfg.event_plane.url)
    service = m["Service/nats"]["spec"]
    assert url.hostname == "nats" and url.port in {p["port"] for p in service["ports"]}
    assert m["Deployment/cacheon-relay"]["spec"]["replicas"] >= 2  # one dies, the other takes its workers
    assert len({w.id for w in cfg.workers}) == len(cfg.workers) and all(w.id for w in cfg.workers)
