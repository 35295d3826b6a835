"""The deployment files agree with the gateway: the shipped config decodes, the probes and ports are
the ones it serves, the container runs a command the CLI has. (No container runtime here: the image
itself is not built by the tests.)"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from cacheon.cli import build_parser
from cacheon.gateway.app import traffic_app
from cacheon.gateway.config import parse, split_listen
from cacheon.gateway.service import Gateway
from tests.conftest import REPO

DEPLOY = REPO / "deploy"


def manifests() -> dict[str, dict]:
    docs = [d for p in sorted((DEPLOY / "kubernetes").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def test_the_configmap_is_a_valid_gateway_config_with_workers_from_the_headless_service(tmp_path: Path) -> None:
    m = manifests()
    cfg = parse(yaml.safe_load(m["ConfigMap/cacheon-gateway"]["data"]["gateway.yaml"]), tmp_path, {})
    (dns,) = cfg.workers_dns
    headless = m["Service/sglang-workers"]["spec"]
    assert headless["clusterIP"] == "None" and dns.name.startswith("sglang-workers.")
    assert dns.port in {p["port"] for p in headless["ports"]}
    container = m["Deployment/cacheon-gateway"]["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == split_listen(cfg.listen)[1]
    mounted = {v["mountPath"] for v in container["volumeMounts"]}
    assert container["args"][1] in mounted and all(
        any(str(spec.tokenizer).startswith(path) for path in mounted) for spec in cfg.models.values())


def test_probes_name_routes_the_gateway_serves(tmp_path: Path) -> None:
    app = traffic_app(Gateway(parse({"policy": "rr"}, tmp_path, {})))
    served = {r.canonical for r in app.router.resources()}
    container = manifests()["Deployment/cacheon-gateway"]["spec"]["template"]["spec"]["containers"][0]
    probes = {container[k]["httpGet"]["path"] for k in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes == {"/livez", "/readyz"} and probes <= served
    annotations = manifests()["Deployment/cacheon-gateway"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in served


def test_the_image_runs_a_command_the_cli_has() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    entry = yaml.safe_load(re.search(r"^ENTRYPOINT (.*)$", text, re.M)[1])
    cmd = yaml.safe_load(re.search(r"^CMD (.*)$", text, re.M)[1])
    assert entry[0] == "cacheon"
    args = build_parser(entry[1]).parse_args([*entry[1:], *cmd])
    assert args.config == Path("/etc/cacheon/gateway.yaml") and args.log_format == "json"
    assert "/livez" in text
