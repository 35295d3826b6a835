"""``cacheon evidence list|show|correct``: read the ledger for one exact identity; correct by superseding."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cacheon.commands._output import add_subcommands, print_json
from cacheon.evidence.classes import parse_class, parse_outcome
from cacheon.evidence.ledger import Record, open_ledger
from cacheon.evidence.standing import standing
from cacheon.runtime.identity import runtime_identity, summary


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("evidence", help="read the evidence ledger for an exact runtime identity")
    actions = add_subcommands(parser, "action", "ACTION")

    listing = actions.add_parser("list", help="records of one identity (default: this host's)")
    listing.add_argument("--identity", metavar="DIGEST", help="identity digest or a unique prefix of it")
    listing.add_argument("--class", dest="evidence_class", metavar="CLASS", help="only this evidence class")
    listing.add_argument(
        "--all", action="store_true", help="also list other identities' records (not counted)"
    )
    listing.set_defaults(handler=run_list)

    show = actions.add_parser("show", help="one record with its identity facts")
    show.add_argument("record_id", type=int, metavar="ID")
    show.set_defaults(handler=run_show)

    correct = actions.add_parser("correct", help="supersede a record with a corrected outcome (append-only)")
    correct.add_argument("record_id", type=int, metavar="ID")
    correct.add_argument("--outcome", required=True, help="pass, fail, blocked or not_run")
    correct.add_argument("--reason", required=True, help="why the original record was wrong")
    correct.set_defaults(handler=run_correct)

    for action in (listing, show, correct):
        action.add_argument(
            "--ledger", metavar="PATH", help="ledger file (default: $CACHEON_LEDGER, else data dir)"
        )
        action.add_argument("--json", action="store_true", help="machine-readable output")


def run_list(args: argparse.Namespace) -> int:
    evidence_class = parse_class(args.evidence_class) if args.evidence_class else None
    with open_ledger(args.ledger, for_write=False) as ledger:
        here = runtime_identity().digest
        identity = ledger.resolve_identity(args.identity) if args.identity else here
        state = standing(ledger, identity, evidence_class)
        others = state.other_identity
        known = {i.digest: i for i in ledger.identities()}
        report: dict[str, Any] = {
            "ledger": str(ledger.path),
            "identity": identity,
            "this_host": identity == here,
            "records": [r.to_json() for r in state.history],
            "current": state.counts(),
            "other_identity_records": len(others),
        }
        if args.all:
            report["other_identity"] = [{**r.to_json(), "scope": "other identity"} for r in others]
    if args.json:
        print_json(report)
        return 0
    facts = known[identity].facts if identity in known else None
    print(f"ledger    {report['ledger']}")
    print(f"identity  {identity}{' (this host)' if report['this_host'] else ''}")
    print(f"          {summary(facts) if facts else 'nothing recorded under this identity'}")
    for record in state.history:
        print(_line(record))
    counts = ", ".join(f"{n} {outcome}" for outcome, n in report["current"].items())
    print(f"current claims: {counts} (superseded records and not_run never count as pass)")
    if args.all:
        for record in others:
            print(_line(record) + f"  [other identity {record.identity_digest[:19]}…]")
    print(
        f"{len(others)} records under other identities: shown as other identity, never counted"
        + ("" if args.all or not others else " (--all lists them)")
    )
    return 0


def run_show(args: argparse.Namespace) -> int:
    with open_ledger(args.ledger, for_write=False) as ledger:
        record = ledger.record(args.record_id)
        identity = ledger.identity(record.identity_digest)
    if args.json:
        print_json({**record.to_json(), "identity_facts": identity.facts})
        return 0
    print(_line(record))
    print(f"identity  {identity.digest}\n          {summary(identity.facts)}")
    print("details   " + json.dumps(record.details, indent=2, sort_keys=True).replace("\n", "\n          "))
    return 0


def run_correct(args: argparse.Namespace) -> int:
    outcome = parse_outcome(args.outcome)
    with open_ledger(args.ledger, for_write=False) as ledger:
        new_id = ledger.correct(args.record_id, outcome, args.reason)
        record = ledger.record(new_id)
    if args.json:
        print_json(record.to_json())
    else:
        print(f"recorded #{new_id}, superseding #{args.record_id}: {record.outcome} ({args.reason})")
    return 0


def _line(record: Record) -> str:
    note = f"  [superseded by #{record.superseded_by}]" if record.superseded_by else ""
    note += f"  [corrects #{record.supersedes}]" if record.supersedes else ""
    return (
        f"#{record.id:<5} {record.recorded_at}  {record.evidence_class:<17} {record.outcome:<8} "
        f"{record.subject}{note}"
    )
