"""``cacheon compat``: the static SGLang canary (installed version vs. the pin, one row per seam)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from typing import Any

from cacheon.commands._output import print_json
from cacheon.commands._progress import Progress
from cacheon.evidence.classes import COMPAT_SUBJECT, EvidenceClass
from cacheon.evidence.record import add_record_arguments, record_from_cli
from cacheon.runtime.canary import CanaryReport, run_canary
from cacheon.runtime.identity import capture_environment
from cacheon.runtime.pin import SGLANG_DIST, SGLANG_PIN
from cacheon.runtime.seams import SEAMS


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compat",
        help="check the installed SGLang against the pin and every registered seam",
        description=f"Import the installed SGLang (no model, no GPU), compare its version with the pin "
        f"{SGLANG_PIN} and check each seam: ok, FAIL (with the reason) or SKIP (optional package absent). "
        "Exit 0 only for the exact pin with no FAIL; 2 otherwise, including when SGLang cannot be imported.",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the whole table and the environment (versions, stand-ins)"
    )
    add_record_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    return emit_canary(args, lambda: run_canary(SGLANG_DIST, SGLANG_PIN, SEAMS), capture_environment, COMPAT_SUBJECT)


def emit_canary(
    args: argparse.Namespace,
    canary: Callable[[], CanaryReport],
    environment: Callable[[], dict[str, Any]],
    subject: str,
) -> int:
    """Run a canary, print it (table or JSON) and record it when asked; the exit code is the verdict."""
    # Upstream import-time chatter goes to stderr so that --json stays one document on stdout.
    with Progress(f"{subject}: importing the installed package, checking it against its pin", quiet=args.json), \
            contextlib.redirect_stdout(sys.stderr):
        report = canary()
        document = {"canary": report.to_json(), "environment": environment()} if args.json or args.record else None
    if args.json:
        print_json(document)
    else:
        print("\n".join(report.lines()))
    record_from_cli(
        args,
        evidence_class=EvidenceClass.STATIC_CANARY,
        subject=subject,
        exit_code=report.exit_code,
        details=document or {},
    )
    return report.exit_code
