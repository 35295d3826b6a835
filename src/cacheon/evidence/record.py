"""``--record [--ledger PATH]`` for the commands that produce evidence (compat, chain-compat, verify).

One helper so that every producer binds its result the same way: the outcome follows the CLI's
exit convention, the identity is captured in the process that ran the check, and the record
line goes to stderr so that ``--json`` output on stdout stays machine-readable.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from typing import Any

from cacheon.errors import UsageError
from cacheon.evidence.classes import EvidenceClass, outcome_from_exit
from cacheon.evidence.ledger import Entry, open_ledger
from cacheon.runtime.identity import runtime_identity

CONTROLS = ("faithful", "broken")


def add_record_arguments(parser: argparse.ArgumentParser, *, control: bool = False) -> None:
    """Add ``--record`` and ``--ledger`` (and ``--control`` for commands that verify bundles)."""
    group = parser.add_argument_group("evidence ledger")
    group.add_argument("--record", action="store_true", help="append the result to the evidence ledger")
    group.add_argument(
        "--ledger", metavar="PATH", help="ledger file (default: $CACHEON_LEDGER, else the user data dir)"
    )
    if control:
        group.add_argument(
            "--control",
            choices=CONTROLS,
            help="record this run as a pin-bump negative control: the bundle is known faithful or broken",
        )


def record_from_cli(
    args: argparse.Namespace,
    *,
    evidence_class: EvidenceClass,
    subject: str,
    exit_code: int,
    details: Mapping[str, Any],
) -> int | None:
    """Append the command's result when ``--record`` was given; returns the record id, else None."""
    control = getattr(args, "control", None)
    if not getattr(args, "record", False):
        if getattr(args, "ledger", None) or control:
            raise UsageError("--ledger and --control only apply with --record")
        return None
    body = {**_jsonable(dict(details)), "exit_code": exit_code}
    if control:
        body["control"] = control
    identity = runtime_identity()
    entry = Entry(evidence_class, subject, identity, outcome_from_exit(exit_code), body)
    with open_ledger(args.ledger, for_write=True) as ledger:
        record_id = ledger.append(entry)
        path = ledger.path
    print(
        f"recorded #{record_id}: {evidence_class.value} {subject} {entry.outcome.value} "
        f"under identity {identity.digest} in {path}",
        file=sys.stderr,
    )
    return record_id


def _jsonable(value: Any) -> Any:
    """Reports may hold NaN/inf or non-JSON objects; keep them readable instead of failing the record."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
