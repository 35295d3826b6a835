"""``cacheon preflight``: a GPU host's three questions, answered separately and never merged.

Device readiness and static compatibility can be checked here; behavioural readiness cannot,
because preflight runs no kernel and serves no model, so it says so and names the checks that do.
The compat canary runs in a child process (``cacheon compat --json``) so that importing SGLang
cannot disturb this process and its own exit code is the verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cacheon
from cacheon.commands._args import positive_int
from cacheon.commands._output import print_json
from cacheon.commands._progress import Progress
from cacheon.evidence.classes import Outcome, outcome_from_exit
from cacheon.runtime.identity import Identity, runtime_identity, summary

BEHAVIOURAL_CHECKS = (
    "cacheon verify BUNDLE --device cuda --record",
    "the live GPU tiers (tests/live, armed by environment variables), recording complete_engine evidence",
)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "preflight",
        help="device readiness, static compatibility, and what only live checks can prove",
        description="Exit 0 when a CUDA device is ready and the compat canary passes, 2 otherwise.",
    )
    parser.add_argument("--json", action="store_true", help="print the three answers and the identity as JSON")
    parser.add_argument("--compat-timeout", type=positive_int, default=900, metavar="SECONDS",
                        help="how long the compat canary's child process may take before it counts as blocked")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with Progress("preflight: capturing the runtime identity", quiet=args.json) as progress:
        identity = runtime_identity()
        progress.update("preflight: running the compat canary in a child process")
        static = static_compatibility(args.compat_timeout)
    report = {
        "identity": identity.to_json(),
        "device": device_readiness(identity),
        "static_compatibility": static,
        "behavioural": {
            "proven": False,
            "reason": "preflight runs no kernel and serves no model; only checks that do can prove behaviour",
            "run": list(BEHAVIOURAL_CHECKS),
        },
    }
    ready = report["device"]["ready"] and report["static_compatibility"]["outcome"] == Outcome.PASS
    if args.json:
        print_json({**report, "ready": ready})
    else:
        _print(identity, report)
    return 0 if ready else 2


def device_readiness(identity: Identity) -> dict[str, Any]:
    """From the identity's own facts, so that what is printed is what evidence binds to."""
    facts = identity.facts
    torch_version = facts["packages"]["torch"]
    gpu = facts["gpu"]
    if torch_version is None:
        reason = "torch is not installed"
    elif facts["torch_cuda"] is None:
        reason = f"no CUDA device (torch {torch_version} has no CUDA build)"
    elif not gpu["count"]:
        reason = f"no CUDA device (torch built for CUDA {facts['torch_cuda']} sees none)"
    else:
        reason = f"{gpu['count']} CUDA device(s), CUDA {facts['torch_cuda']}"
    return {
        "ready": bool(gpu["count"]),
        "reason": reason,
        "torch": torch_version,
        "cuda": facts["torch_cuda"],
        "devices": gpu["devices"],
    }


def static_compatibility(timeout_s: int) -> dict[str, Any]:
    """Run the compat canary in a child process; its exit code is the verdict."""
    command = [sys.executable, "-m", "cacheon", "compat", "--json"]
    package_root = str(Path(cacheon.__file__).resolve().parents[1])  # the child runs this same cacheon
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
    }
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        return {
            "outcome": Outcome.BLOCKED.value,
            "reason": f"compat canary ran past {timeout_s}s",
            "report": None,
        }
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = None
    outcome = outcome_from_exit(done.returncode)
    stderr = done.stderr.strip().splitlines()
    reason = f"cacheon compat exited {done.returncode}" + (
        f": {stderr[-1]}" if stderr and outcome != "pass" else ""
    )
    return {"outcome": outcome.value, "reason": reason, "report": report}


def _print(identity: Identity, report: dict[str, Any]) -> None:
    device, static = report["device"], report["static_compatibility"]
    print(f"identity                 {identity.digest}  (evidence recorded here binds to it)")
    print(f"                         {summary(identity.facts)}")
    print(f"1 device readiness       {'READY' if device['ready'] else 'NOT READY'}: {device['reason']}")
    for index, d in enumerate(device["devices"]):
        print(f"                         gpu {index}: {d['name']} (capability {d['capability']})")
    print(f"2 static compatibility   {static['outcome'].upper()}: {static['reason']}")
    print("3 behavioural readiness  NOT PROVEN by preflight; run:")
    for check in BEHAVIOURAL_CHECKS:
        print(f"                         - {check}")
