"""Live seam activation on a GPU host: the proof of tests/engines/activation_proof.py, in the worker image.

The same three boots, prompts and judgement as the CPU tier (tests/engines/test_activation_seam.py,
which runs in ``make test``); only the server differs: the worker image under docker on GPUs, every
TP rank armed through the ``sglang.srt.plugins`` entry point, and receipts required from every rank.

Opt-in: ``CACHEON_LIVE_SERVE_TESTS=1`` with ``CACHEON_SERVE_IMAGE`` (SGLang at the pin with cacheon
installed) and ``CACHEON_SERVE_MODEL`` (a model id, or a host directory mounted read-only at the same
path). Optional: ``CACHEON_SERVE_GPU`` (docker ``--gpus`` device list, default ``0``, or ``0,1`` for
TP 2), ``CACHEON_SERVE_TP`` (1 or 2), ``CACHEON_SERVE_BOOT_TIMEOUT_S`` (default 900). Armed with a
missing prerequisite it fails; it never skips once armed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from cacheon.sim.launch import free_port
from tests.engines import activation_proof as proof

ARMED = os.environ.get("CACHEON_LIVE_SERVE_TESTS") == "1"
pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not ARMED, reason="live tier: set CACHEON_LIVE_SERVE_TESTS=1 (GPU host, worker image)"),
]



@dataclass(frozen=True)
class Serve:
    image: str
    model: str
    gpus: str
    tp: int
    boot_timeout_s: int


@pytest.fixture(scope="module")
def serve() -> Serve:
    missing = [name for name in ("CACHEON_SERVE_IMAGE", "CACHEON_SERVE_MODEL") if not os.environ.get(name)]
    if missing:
        pytest.fail(f"CACHEON_LIVE_SERVE_TESTS=1 but {', '.join(missing)} is not set", pytrace=False)
    if shutil.which("docker") is None:
        pytest.fail("CACHEON_LIVE_SERVE_TESTS=1 but docker is not on PATH", pytrace=False)
    tp = int(os.environ.get("CACHEON_SERVE_TP", "1"))
    if tp not in (1, 2):
        pytest.fail(f"CACHEON_SERVE_TP must be 1 or 2, got {tp}", pytrace=False)
    return Serve(
        image=os.environ["CACHEON_SERVE_IMAGE"],
        model=os.environ["CACHEON_SERVE_MODEL"],
        gpus=os.environ.get("CACHEON_SERVE_GPU", "0" if tp == 1 else "0,1"),
        tp=tp,
        boot_timeout_s=int(os.environ.get("CACHEON_SERVE_BOOT_TIMEOUT_S", "900")),
    )


def _post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def _boot(serve: Serve, bundle: Path | None, receipts: Path) -> list[list[int]]:
    """Boot the image (armed with ``bundle`` or not), wait for health, return the greedy token ids of
    every prompt."""
    port = free_port()
    name = f"cacheon-live-{os.getpid()}-{port}"
    command = [
        "docker",
        "run",
        "-d",
        "--rm",
        "--name",
        name,
        "--gpus",
        f'"device={serve.gpus}"',
        "--ipc=host",
        "-p",
        f"127.0.0.1:{port}:30000",
        "-v",
        f"{receipts}:/cacheon-receipts",
    ]
    if Path(serve.model).is_dir():
        command += ["-v", f"{serve.model}:{serve.model}:ro"]
    if bundle is not None:
        command += [
            "-v",
            f"{bundle}:/cacheon-bundle:ro",
            "-e",
            "CACHEON_BUNDLE=/cacheon-bundle",
            "-e",
            "CACHEON_RECEIPT_DIR=/cacheon-receipts",
        ]
    command += [
        serve.image,
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        serve.model,
        "--tp-size",
        str(serve.tp),
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--random-seed",
        "0",
    ]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    try:
        deadline = time.monotonic() + serve.boot_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            running = subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Running}}", name], capture_output=True, text=True
            )
            if running.stdout.strip() != "true" or time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", "--tail", "60", name], capture_output=True, text=True)
                pytest.fail(f"server ({bundle or 'unarmed'}) did not become healthy:\n{logs.stdout}{logs.stderr}")
            time.sleep(5)
        sampling = {"temperature": 0, "max_new_tokens": proof.MAX_NEW_TOKENS, "ignore_eos": True}
        return [
            _post(f"http://127.0.0.1:{port}/generate", {"text": text, "sampling_params": sampling}, timeout=300)[
                "output_ids"
            ]
            for text in proof.PROMPTS
        ]
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, text=True)


def test_exact_bundle_reproduces_unarmed_and_broken_bundle_changes_it(serve, tmp_path):
    arms = {}
    for name, bundle in proof.ARMS.items():
        receipts = tmp_path / name
        receipts.mkdir()
        receipts.chmod(0o777)  # the server may run as another user inside the image
        outputs = _boot(serve, bundle, receipts)
        arms[name] = proof.Arm(name, outputs, [json.loads(p.read_text()) for p in receipts.glob("*.json")])
    verdict = proof.judge(arms, min_ranks=serve.tp)  # one receipt per scheduler process: every TP rank
    assert verdict.passed, verdict.problems
