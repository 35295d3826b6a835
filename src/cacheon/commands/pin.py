"""``cacheon pin status|plan|freeze|step``: pin-bump gates, answered from the ledger per exact identity."""

from __future__ import annotations

import argparse
from typing import Any

from cacheon.commands._output import add_subcommands, print_json
from cacheon.errors import UsageError
from cacheon.evidence.gates import (
    GATES,
    STEP_KEYS,
    IdentityStatus,
    candidates,
    evaluate,
    record_step,
)
from cacheon.evidence.ledger import VerifiedLedger, open_ledger, open_verified_ledger
from cacheon.printable import escape_controls
from cacheon.runtime.identity import Identity, runtime_identity, summary


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("pin", help="pin-bump gates: what is proven for a pin's exact identity")
    actions = add_subcommands(parser, "action", "ACTION")

    status = actions.add_parser("status", help="each gate as met / missing / failed, with its records")
    status.add_argument("--target", metavar="VERSION", help="SGLang version (default: this host's identity)")
    status.add_argument("--identity", metavar="DIGEST", help="only this identity (digest or unique prefix)")
    status.add_argument("--json", action="store_true", help="print the gates per identity as JSON")
    status.set_defaults(handler=run_status)

    plan = actions.add_parser("plan", help="the reviewed pin-bump procedure for a version, and what is left")
    plan.add_argument("--to", required=True, metavar="VERSION", help="the SGLang version to bump the pin to")
    plan.add_argument("--json", action="store_true", help="print the procedure and what is left as JSON")
    plan.set_defaults(handler=run_plan)

    freeze = actions.add_parser("freeze", help="gate 1: capture this host as the candidate identity")
    freeze.add_argument("--to", required=True, metavar="VERSION", help="the SGLang version this host runs as candidate")
    freeze.add_argument("--note", default="", help="what was frozen, where its output lives")
    freeze.add_argument("--json", action="store_true", help="print the recorded step as JSON")
    freeze.set_defaults(handler=run_step, step="freeze")

    step = actions.add_parser(
        "step", help="record a maintainer step (arena recalibration, identities, migration)"
    )
    step.add_argument("step", choices=[k for k in STEP_KEYS if k != "freeze"], help="the maintainer step done")
    step.add_argument("--to", required=True, metavar="VERSION", help="the SGLang version the bump goes to")
    step.add_argument("--note", default="", help="what was done, where its output lives")
    step.add_argument("--json", action="store_true", help="print the recorded step as JSON")
    step.set_defaults(handler=run_step)

    for action in (status, plan, freeze, step):
        action.add_argument(
            "--ledger", metavar="PATH", help="ledger file (default: $CACHEON_LEDGER, else data dir)"
        )


def run_status(args: argparse.Namespace) -> int:
    ledger = open_verified_ledger(args.ledger)
    identities = _identities(ledger, args.target, args.identity)
    statuses = [evaluate(ledger, identity) for identity in identities]
    target = args.target or (identities[0].sglang_version if identities else None)
    if args.json:
        print_json({"target": target, "identities": [_json(s) for s in statuses], "guarantee": ledger.guarantee()})
    else:
        _print_status(target, statuses)
        print(escape_controls(f"ledger checked: {ledger.guarantee()['summary']}"))
    return 0 if any(s.all_met for s in statuses) else 2


def run_plan(args: argparse.Namespace) -> int:
    ledger = open_verified_ledger(args.ledger)
    statuses = [evaluate(ledger, identity) for identity in candidates(ledger, args.to)]
    if args.json:
        print_json({
            "target": args.to,
            "gates": [{"number": g.number, "title": g.title, "run": g.how.replace("VERSION", args.to),
                       "needs_gpu": g.needs_gpu} for g in GATES],
            "identities": [_json(s) for s in statuses],
            "guarantee": ledger.guarantee(),
        })
        return 0
    print(f"pin bump to sglang {args.to}: each gate needs evidence under the candidate's exact identity")
    for gate in GATES:
        where = "needs a GPU host" if gate.needs_gpu else "any host of the identity"
        print(f"  {gate.number} {gate.title}\n      run: {gate.how.replace('VERSION', args.to)}  ({where})")
    if not statuses:
        print(
            f"no identity with sglang {args.to} in the ledger yet: "
            f"start with `cacheon pin freeze --to {args.to}` on the candidate host"
        )
    for status in statuses:
        left = [r for r in status.results if r.verdict.status != "met"]
        todo = ", ".join(f"{r.gate.number} ({r.verdict.status})" for r in left) or "none: all gates met"
        print(f"identity {status.identity.digest}: left: {todo}")
    print(escape_controls(f"ledger checked: {ledger.guarantee()['summary']}"))
    return 0


def run_step(args: argparse.Namespace) -> int:
    identity = runtime_identity()
    with open_ledger(args.ledger, for_write=True) as ledger:
        record_id = record_step(ledger, identity, args.step, args.to, args.note)
        path = ledger.path
    if args.json:
        print_json({"record": record_id, "step": args.step, "target": args.to, "identity": identity.digest,
                    "ledger": str(path)})
        return 0
    print(f"recorded #{record_id}: {args.step} for sglang {args.to} under identity {identity.digest}")
    return 0


def _identities(ledger: VerifiedLedger, target: str | None, wanted: str | None) -> list[Identity]:
    if wanted:
        identity = ledger.identity(ledger.resolve_identity(wanted))
        if target and identity.sglang_version != target:
            raise UsageError(
                f"identity {identity.digest} runs sglang {identity.sglang_version}, not {target}"
            )
        return [identity]
    if target:
        return candidates(ledger, target)
    return [runtime_identity()]


def _json(status: IdentityStatus) -> dict[str, Any]:
    return {
        "identity": status.identity.digest,
        "facts": status.identity.facts,
        "all_met": status.all_met,
        "gates": [r.to_json() for r in status.results],
        "other_pins": status.other_pins,
    }


def _print_status(target: str | None, statuses: list[IdentityStatus]) -> None:
    print(f"pin status for sglang {target or '(none)'}")
    if not statuses:
        print(
            f"  no identity with sglang {target} in the ledger: gate 1 missing "
            f"(run `cacheon pin freeze --to {target}` on the candidate host)"
        )
    for status in statuses:
        print(f"identity {status.identity.digest}\n  {escape_controls(summary(status.identity.facts))}")
        for result in status.results:
            records = " ".join(f"#{r.id}" for r in result.verdict.records)
            gate, verdict = result.gate, result.verdict
            tail = f"  [{records}]" if records else ""
            print(escape_controls(f"  {gate.number} {verdict.status:<8} {gate.title}: {verdict.reason}{tail}"))
        others = ", ".join(f"{version}: {n} records" for version, n in status.other_pins.items()) or "none"
        print(escape_controls(f"  prior results under other pins (kept with their original pin, never counted): "
                              f"{others}"))
