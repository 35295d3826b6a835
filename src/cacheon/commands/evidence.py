"""``cacheon evidence list|show|correct|verify|checkpoint|migrate``: read the ledger for one exact
identity, correct by superseding, and check its hash chain (against a signed checkpoint if held)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cacheon.commands._args import positive_int
from cacheon.commands._output import add_subcommands, print_json
from cacheon.errors import UsageError
from cacheon.evidence import checkpoint, keys
from cacheon.evidence.boundary import Malformed
from cacheon.evidence.chain import ChainCheck, Head
from cacheon.evidence.classes import parse_class, parse_outcome
from cacheon.evidence.ledger import (
    Ledger,
    LedgerTampered,
    Record,
    VerifiedLedger,
    open_ledger,
    open_verified_ledger,
    resolve_ledger_path,
)
from cacheon.evidence.standing import standing
from cacheon.printable import escape_controls
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
    show.add_argument("record_id", type=positive_int, metavar="ID", help="the record's number (#ID in `list`)")
    show.set_defaults(handler=run_show)

    correct = actions.add_parser("correct", help="supersede a record with a corrected outcome (append-only)")
    correct.add_argument("record_id", type=positive_int, metavar="ID", help="the number of the record to supersede")
    correct.add_argument("--outcome", required=True, help="pass, fail, blocked or not_run")
    correct.add_argument("--reason", required=True, help="why the original record was wrong")
    correct.set_defaults(handler=run_correct)

    verify = actions.add_parser(
        "verify",
        help="walk the hash chain; with a checkpoint key, also check the ledger against a signed head",
        description="Exit 0 when every link holds (and the checkpoint or expected head matches), 2 at the "
        "first broken link. The chain alone cannot show a truncated tail or a whole file re-hashed "
        "consistently: that takes --checkpoint-key (a signed head) or --expect-head (a remembered one).",
    )
    verify.add_argument(
        "--checkpoint-key",
        action="append",
        default=[],
        metavar="PUB",
        help="trusted checkpoint signer (64 hex or a .pub file; repeatable): a checkpoint is then required",
    )
    verify.add_argument(
        "--checkpoint", type=Path, metavar="FILE", help="checkpoint to check (default: LEDGER.checkpoint.json)"
    )
    verify.add_argument(
        "--expect-head", metavar="SEQ:HASH", help="a head printed by an earlier verify: the ledger must still hold it"
    )
    verify.set_defaults(handler=run_verify)

    sign = actions.add_parser(
        "checkpoint",
        help="sign the verified chain head (Ed25519) into a checkpoint file kept outside the ledger",
        description="Refuses a broken chain, and refuses to replace a checkpoint the ledger contradicts "
        "(that would vouch for a rewritten history). Keep a copy where the ledger's writers cannot write.",
    )
    sign.add_argument("--key", required=True, type=Path, help="private key file from `cacheon release keygen`")
    sign.add_argument("--out", type=Path, metavar="FILE", help="checkpoint file (default: LEDGER.checkpoint.json)")
    sign.set_defaults(handler=run_checkpoint)

    migrate = actions.add_parser(
        "migrate",
        help="chain the records of a ledger written before the hash chain (schema v1)",
        description="Hashes the records as they are now: the chain then shows any later change, but "
        "cannot vouch for what happened to the file before the migration.",
    )
    migrate.set_defaults(handler=run_migrate)

    state = actions.add_parser(
        "state",
        help="the state of record: every identity's current claims and pin-bump gates (Markdown)",
        description="What the documentation site's State of record page shows, from a verified ledger: per "
        "exact runtime identity, the current record of every claim and what each pin-bump gate still needs.",
    )
    state.set_defaults(handler=run_state)

    for action in (listing, show, correct, verify, sign, migrate, state):
        action.add_argument(
            "--ledger", metavar="PATH", help="ledger file (default: $CACHEON_LEDGER, else data dir)"
        )
        action.add_argument("--json", action="store_true", help="machine-readable output")


def run_list(args: argparse.Namespace) -> int:
    evidence_class = parse_class(args.evidence_class) if args.evidence_class else None
    ledger = open_verified_ledger(args.ledger)
    here = runtime_identity().digest
    identity = ledger.resolve_identity(args.identity) if args.identity else here
    state = standing(ledger, identity, evidence_class)
    others = state.other_identity
    known = {i.digest: i for i in ledger.identities()}
    report: dict[str, Any] = {
        "ledger": str(ledger.path),
        "head": ledger.head.to_json(),
        "identity": identity,
        "this_host": identity == here,
        "records": [r.to_json() for r in state.history],
        "current": state.counts(),
        "other_identity_records": len(others),
        "guarantee": ledger.guarantee(),
    }
    if args.all:
        report["other_identity"] = [{**r.to_json(), "scope": "other identity"} for r in others]
    if args.json:
        print_json(report)
        return 0
    facts = known[identity].facts if identity in known else None
    _say(f"ledger    {report['ledger']}")
    _say(f"checked   {report['guarantee']['summary']}")
    _say(f"identity  {identity}{' (this host)' if report['this_host'] else ''}")
    _say(f"          {summary(facts) if facts else 'nothing recorded under this identity'}")
    for record in state.history:
        _say(_line(record))
    counts = ", ".join(f"{n} {outcome}" for outcome, n in report["current"].items())
    _say(f"current claims: {counts} (superseded records and not_run never count as pass)")
    if args.all:
        for record in others:
            _say(_line(record) + f"  [other identity {record.identity_digest[:19]}…]")
    _say(
        f"{len(others)} records under other identities: shown as other identity, never counted"
        + ("" if args.all or not others else " (--all lists them)")
    )
    return 0


def run_show(args: argparse.Namespace) -> int:
    ledger = open_verified_ledger(args.ledger)
    record = ledger.record(args.record_id)
    identity = ledger.identity(record.identity_digest)
    if args.json:
        print_json({**record.to_json(), "identity_facts": identity.facts, "guarantee": ledger.guarantee()})
        return 0
    _say(_line(record))
    _say(f"checked   {ledger.guarantee()['summary']}")
    _say(f"identity  {identity.digest}\n          {summary(identity.facts)}")
    _say("details   " + json.dumps(record.details, indent=2, sort_keys=True).replace("\n", "\n          "))
    return 0


def run_correct(args: argparse.Namespace) -> int:
    outcome = parse_outcome(args.outcome)
    with open_ledger(args.ledger, for_write=False) as ledger:
        new_id = ledger.correct(args.record_id, outcome, args.reason)
        record = ledger.verified().record(new_id)
    if args.json:
        print_json(record.to_json())
    else:
        _say(f"recorded #{new_id}, superseding #{args.record_id}: {record.outcome} ({args.reason})")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    if args.checkpoint and not args.checkpoint_key:
        raise UsageError("a checkpoint is only checked against a key you trust: add --checkpoint-key PUB")
    trusted = [keys.parse_public_key(k) for k in args.checkpoint_key]
    expected = checkpoint.parse_head(args.expect_head) if args.expect_head else None
    with open_ledger(args.ledger, for_write=False) as ledger:
        check = ledger.check()
    report: dict[str, Any] = {"ledger": str(ledger.path), **check.to_json(), "checkpoint": None, "expected_head": None}
    problems = [] if check.broken is None else [f"record #{check.broken.record}: {check.broken.reason}"]
    if check.broken is None:
        view = VerifiedLedger.from_check(ledger.path, check)
        if trusted:
            path = args.checkpoint or checkpoint.default_path(ledger.path)
            report["checkpoint"], problem = _against_checkpoint(view, path, trusted)
            problems += [problem] if problem else []
        if expected is not None:
            problem = checkpoint.contradiction(view, None, expected)
            report["expected_head"] = {**expected.to_json(), "ok": problem is None}
            problems += [f"expected head: {problem}"] if problem else []
    report["ok"] = not problems
    report["problems"] = problems
    report["limits"] = _limits(report)
    if args.json:
        print_json(report)
    else:
        _print_verify(report, check)
    return 0 if report["ok"] else 2


def _against_checkpoint(
    view: VerifiedLedger, path: Path, trusted: list[Ed25519PublicKey]
) -> tuple[dict[str, Any], str | None]:
    summary_: dict[str, Any] = {"path": str(path), "ok": False}
    try:
        vouched = checkpoint.vouch(path, trusted)
    except Malformed as exc:
        return summary_, f"checkpoint: {exc} (a verifier holding a key requires a checkpoint it signed)"
    cp = vouched.checkpoint
    summary_.update(seq=cp.seq, head=cp.head, signed_at=cp.signed_at, signers=list(vouched.signers))
    problem = checkpoint.contradiction(view, cp.ledger, Head(cp.seq, cp.head))
    summary_["ok"] = problem is None
    return summary_, f"checkpoint: {problem}" if problem else None


def _limits(report: dict[str, Any]) -> list[str]:
    """What this run could not have detected: said every time, so a pass is never read as more."""
    if not report["ok"]:
        return []
    cp = report["checkpoint"]
    vouched = max([h["seq"] for h in (cp, report["expected_head"]) if h and h.get("ok")], default=None)
    if vouched is None:
        return [
            "without a checkpoint or expected head, a cut-off tail, a re-hashed last record or a whole file "
            "rewritten with every hash recomputed cannot be told from an honest ledger"
        ]
    head = report["head"]["seq"]
    if vouched < head:
        return [f"records #{vouched + 1}..#{head} are after the vouched head: protected by the chain alone"]
    return []


def _print_verify(report: dict[str, Any], check: ChainCheck) -> None:
    head = report["head"]
    if report["ok"]:
        _say(f"OK ledger {report['ledger']}: {report['records']} records, every link holds")
        _say(f"head      {head['seq']}:{head['hash']}")
    else:
        _say(f"FAIL ledger {report['ledger']}: {report['problems'][0]}")
        for problem in report["problems"][1:]:
            _say(f"  - {problem}")
    origin = report["origin"] or {}
    if origin.get("kind") == "migrated":
        _say(
            f"origin    migrated from an unchained ledger with {origin['records']} records: the chain vouches "
            "for them as they were at migration, not for what happened to the file before"
        )
    cp = report["checkpoint"]
    if cp and cp["ok"]:
        signers = ", ".join(s[:16] + "…" for s in cp["signers"])
        _say(f"checkpoint #{cp['seq']} signed {cp['signed_at']} by {signers}: held")
    for limit in report["limits"]:
        _say(f"note      {limit}")


def run_checkpoint(args: argparse.Namespace) -> int:
    key = keys.load_private_key(args.key)
    with open_ledger(args.ledger, for_write=False) as ledger:  # the existing checkpoint is checked below
        view = ledger.verified()
    out = args.out or checkpoint.default_path(view.path)
    if out.exists():
        try:
            _, previous = checkpoint.read(out)
        except Malformed as exc:
            raise UsageError(f"existing checkpoint {out} is unreadable ({exc}): move it away first") from None
        problem = checkpoint.contradiction(view, previous.ledger, Head(previous.seq, previous.head))
        if problem:
            raise LedgerTampered(
                f"refusing to replace checkpoint {out}: {problem}; a new checkpoint would vouch for it"
            )
    envelope = checkpoint.sign(view, key)
    checkpoint.write(out, envelope)
    result = {
        "checkpoint": str(out),
        "ledger": str(view.path),
        "ledger_id": view.header.ledger_id,
        "head": view.head.to_json(),
        "signer": keys.public_hex(key.public_key()),
    }
    if args.json:
        print_json(result)
    else:
        _say(f"checkpoint {out}: ledger {view.header.ledger_id} head {view.head.seq}:{view.head.hash}")
        _say(f"signed by  {result['signer']} (keep a copy where the ledger's writers cannot write)")
    return 0


def run_migrate(args: argparse.Namespace) -> int:
    path, _ = resolve_ledger_path(args.ledger)
    with Ledger.open(path, create=False, migrate=True) as ledger:
        check = ledger.check()
    origin = check.header.origin_json() if check.header else {}
    result = {"ledger": str(path), "head": check.head.to_json() if check.head else None, "origin": origin}
    if args.json:
        print_json(result)
    else:
        chained = origin.get("records", 0) if origin.get("kind") == "migrated" else 0
        head = check.head.seq if check.head else 0
        _say(f"ledger {path} is chained (head #{head}); records chained by migration: {chained}")
    return 0


def run_state(args: argparse.Namespace) -> int:
    from cacheon.evidence.state import state_of_record

    ledger = open_verified_ledger(args.ledger)
    record = state_of_record(ledger)
    if args.json:
        print_json({**record.to_json(), "guarantee": ledger.guarantee()})
    else:
        _say(record.to_markdown(), end="")
        print(escape_controls(f"checked: {ledger.guarantee()['summary']}"), file=sys.stderr)  # the page stays as is
    return 0


def _say(text: str, end: str = "\n") -> None:
    """Print a line of the report; every value in it may come from the ledger or a checkpoint file, so
    every character that is not plain text is escaped (none can erase a line or draw one)."""
    print(escape_controls(text, keep_newlines=True), end=end)


def _line(record: Record) -> str:
    note = f"  [superseded by #{record.superseded_by}]" if record.superseded_by else ""
    note += f"  [corrects #{record.supersedes}]" if record.supersedes else ""
    return (
        f"#{record.id:<5} {record.recorded_at}  {record.evidence_class:<17} {record.outcome:<8} "
        f"{record.subject}{note}"
    )
