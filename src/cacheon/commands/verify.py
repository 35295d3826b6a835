"""``cacheon verify``: prove a bundle computes its slots, its code confined in a sandbox."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from cacheon.bundle.admission import admit
from cacheon.bundle.archive import open_bundle
from cacheon.commands._args import non_negative_int, positive_float, positive_int
from cacheon.commands._output import print_json
from cacheon.commands._progress import Progress
from cacheon.contract.catalog import FLOAT_DTYPES
from cacheon.contract.profiles import get_profile
from cacheon.errors import UsageError
from cacheon.evidence.classes import EvidenceClass, bundle_subject
from cacheon.evidence.record import add_record_arguments, record_from_cli
from cacheon.verify.plan import (
    DEFAULT_OP_TIMEOUT,
    DEFAULT_RUN_TIMEOUT,
    Confinement,
    VerifyOptions,
    case_kind,
    draw_seed,
)
from cacheon.verify.report import CaseResult, OpReport, StageProgress, StageResult, VerifyReport
from cacheon.verify.runner import chosen_ops, verify_bundle
from cacheon.verify.sandbox import require_bubblewrap

EXIT = {"PASS": 0, "NUMERICAL_PASS": 0, "FAIL": 2}
HEARTBEAT_S = 5.0  # off a terminal (CI logs, a pipe): the status as a line this often


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="verify a bundle against the trusted float64 references",
        description="Scan BUNDLE, then run each op in a bubblewrap sandbox (new namespaces, unprivileged uid, "
        "no network, read-only binds of the interpreter and a private copy of the bundle, resource limits) over "
        "every registered shape, seeded token jitter and shapes drawn across the slot's serving range, each dtype "
        "and two trials, then a stability stage of many interleaved calls; outputs are judged in this process "
        "against a float64 reference. Verdicts: PASS; FAIL; NUMERICAL_PASS when numerics match but the required "
        "CUDA-graph proof could not run (CPU). Exit 0 PASS/NUMERICAL_PASS, 2 FAIL (or scan violations), "
        "1 infrastructure error, unusable input, or no sandbox available.",
    )
    p.add_argument("bundle", type=Path, help="bundle directory or .tar.gz archive")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the candidate runs")
    p.add_argument(
        "--dtype", action="append", choices=FLOAT_DTYPES, default=[], help="restrict to this dtype (repeatable; "
        "default: every dtype of the manifest)"
    )
    p.add_argument("--seed", type=non_negative_int, default=None, help="run seed for every draw (shapes, input "
                   "statistics, poison, stability order); default: drawn from OS entropy and printed, so --seed "
                   "reproduces it")
    p.add_argument("--case", metavar="[SLOT:]ID", help="run only this eager case, by the id printed with each case "
                   "line (DTYPE/KI: K is r registered, j its jitter, d drawn, s serving-size; I its index); drawn "
                   "shapes come from the run seed, so give that run's --seed too. A check for the author: never "
                   "recorded, never a bundle's verdict")
    p.add_argument("--timeout", type=positive_float, default=120.0, metavar="SECONDS",
                   help="seconds one kernel call (one read or write of the candidate's channel) may take before "
                   "the candidate's sandbox is killed")
    p.add_argument("--op-timeout", type=positive_float, default=DEFAULT_OP_TIMEOUT, metavar="SECONDS",
                   help="wall-clock seconds one op may take in all, its sandbox's start included, before the "
                   f"sandbox is killed and the op fails (default {DEFAULT_OP_TIMEOUT:g})")
    p.add_argument("--run-timeout", type=positive_float, default=DEFAULT_RUN_TIMEOUT, metavar="SECONDS",
                   help="wall-clock seconds the whole run may take; an op still running then fails, and the ops "
                   f"after it fail unrun (default {DEFAULT_RUN_TIMEOUT:g})")
    p.add_argument("--graph-replays", type=non_negative_int, default=3, metavar="N",
                   help="poisoned CUDA-graph replays per case (cuda only; 0 skips the graph proof)")
    p.add_argument("--stability-calls", type=non_negative_int, default=1000, metavar="N",
                   help="calls of the stability stage per op, a random subset judged (0 skips it)")
    p.add_argument("--keep-going", action="store_true", help="run every case even after a failure "
                   "(default: stop an op at its first failing case)")
    p.add_argument("--world-size", type=positive_int, default=None, metavar="N",
                   help="ranks for collective slots (default 2; gloo on cpu, nccl with one GPU per rank on cuda)")
    p.add_argument("--model", default=None, metavar="KEY",
                   help="judge against a model profile's specialisation of the slots (e.g. gpt-oss)")
    p.add_argument("--confinement", choices=[c.value for c in Confinement], default=Confinement.BUBBLEWRAP.value,
                   help="bubblewrap (verify refuses to run when it is unavailable) or none: run the "
                   "candidate as a plain child process; its evidence is marked unconfined and never counts "
                   "where confined evidence is required")
    # SUPPRESS: the same flag as `cacheon --debug`, whichever side of the command it is written on
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="also print tracebacks from the candidate's process (and any error's)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON (no case lines, no progress)")
    add_record_arguments(p, control=True)
    p.set_defaults(handler=run)


def _rerun(args: argparse.Namespace, report: VerifyReport, op: OpReport, case_id: str) -> str:
    """The command that reruns one case of this run: same seed, same choices that change the plan."""
    qualified = f"{op.slot}:{case_id}" if len(report.ops) > 1 else case_id
    words = ["cacheon verify", str(args.bundle), "--seed", str(report.seed), "--case", qualified]
    words += ["--device", args.device] if args.device != "cpu" else []
    words += ["--model", args.model] if args.model else []
    words += ["--world-size", str(args.world_size)] if args.world_size else []
    words += ["--confinement", args.confinement] if args.confinement != Confinement.BUBBLEWRAP.value else []
    return " ".join(words)


def _print_summary(args: argparse.Namespace, report: VerifyReport) -> None:
    if "model_profile" in report.environment:
        print(f"model profile: {report.environment['model_profile']}")
    for op in report.ops:
        print(f"{op.slot} ({op.source}:{op.entry}): {op.verdict} - {op.reason}")
        if args.debug and op.detail:
            print("  traceback from the candidate's process (untrusted):\n    "
                  + op.detail.strip().replace("\n", "\n    "))
        if op.candidate_output:
            print("  candidate output (untrusted):\n    " + op.candidate_output.strip().replace("\n", "\n    "))
        failed = op.first_failure()
        if failed is not None and failed.case_id and report.case is None:
            print(f"  rerun that case alone: {_rerun(args, report, op, failed.case_id)}")
    print(f"confinement: {report.confinement}   seed: {report.seed} (--seed {report.seed} reproduces this run)")
    if report.case is not None:
        print(f"--case {report.case}: one case ran; a check for its author, not the bundle's verdict "
              "(run without --case for that)")
    elif report.unjudged:
        left = "; ".join(f"{slot}: {', '.join(dtypes)}" for slot, dtypes in report.unjudged.items())
        print(f"--dtype {', '.join(args.dtype)}: a partial verdict, the manifest's other dtypes were not judged "
              f"({left}); run without --dtype for the bundle's verdict")
    print(f"{report.verdict}  {report.bundle_id} {report.bundle_digest}")


def _check_case(args: argparse.Namespace) -> None:
    if args.case is None:
        return
    if args.record:
        raise UsageError("--case runs one case: it is never recorded as evidence (drop --record or --case)")
    kind = case_kind(args.case)
    if kind is None:
        raise UsageError(f"--case {args.case}: a case id is [SLOT:]DTYPE/KI, e.g. float32/r0 (printed with each "
                         "case line)")
    if kind.seeded and args.seed is None:
        raise UsageError(f"--case {args.case}: a {kind.value} case's shape is drawn from the run seed; add the "
                         "--seed printed with the run it failed in")


def run(args: argparse.Namespace) -> int:
    _check_case(args)
    seed = args.seed if args.seed is not None else draw_seed()
    confinement = Confinement(args.confinement)
    options = VerifyOptions(
        device=args.device, dtypes=tuple(args.dtype), seed=seed, timeout=args.timeout,
        op_timeout=args.op_timeout, run_timeout=args.run_timeout,
        graph_replays=args.graph_replays, keep_going=args.keep_going, world_size=args.world_size,
        profile=get_profile(args.model) if args.model else None, confinement=confinement,
        stability_calls=args.stability_calls, case=args.case,
    )
    with open_bundle(args.bundle) as root:
        admission = admit(root)
        admission.require_usable_manifest(args.bundle)
        if not admission.admitted:
            for f in admission.scan.findings:
                print(f, file=sys.stderr)
            print(f"FAIL  {admission.manifest.bundle_id}: scan found {len(admission.scan.findings)} violation(s); "
                  "the bundle was not executed", file=sys.stderr)
            details = {"verdict": "FAIL", "reason": "scan violations", "confinement": confinement.value,
                       "executed": False}
            if args.json:
                print_json({**details, "bundle_digest": admission.digest, "scan": admission.scan.to_json()})
            # a snapshot that refused an entry (a link, ...) has no digest: the record names the manifest id
            named = admission.manifest.bundle_id
            subject = bundle_subject(admission.digest) if admission.digest else f"bundle-id:{named}"
            record_from_cli(args, evidence_class=EvidenceClass.COMPONENT, subject=subject, exit_code=2, details=details)
            return 2
        assert admission.digest is not None  # an admitted snapshot refused nothing, so it has a digest
        chosen_ops(admission.manifest, options, seed)  # an unknown --case is refused before anything runs
        if confinement is Confinement.BUBBLEWRAP:
            require_bubblewrap()  # refuse before anything is printed or run
        if not args.json:
            print(f"verifying {admission.manifest.bundle_id} {admission.digest} on {args.device} "
                  f"(confinement {confinement.value}, seed {seed})", flush=True)
        with Progress(f"verifying {admission.manifest.bundle_id}: starting the sandbox", quiet=args.json,
                      heartbeat_s=HEARTBEAT_S) as shown:
            # the admitted snapshot: its bytes run and its digest is recorded, the path is not read again
            reporter = _reporter(args, shown, admission.manifest.bundle_id)
            report = verify_bundle(admission.snapshot, admission.manifest, options, reporter)
    if args.json:
        print_json(report.to_json(debug=args.debug))
    else:
        _print_summary(args, report)
    code = EXIT[report.verdict]
    if report.case is None:
        record_from_cli(args, evidence_class=EvidenceClass.COMPONENT, subject=bundle_subject(report.bundle_digest),
                        exit_code=code, details={**report.to_json(), "confinement": report.confinement})
    return code


def _reporter(args: argparse.Namespace, shown: Progress, name: str
              ) -> Callable[[str, CaseResult | StageResult | StageProgress], None]:
    """Each judged case: its line on stdout (text mode) and the status line's latest news."""
    judged = {"calls": 0}

    def report(mode: str, event: CaseResult | StageResult | StageProgress) -> None:
        if isinstance(event, StageProgress):  # the stability stage's own count, not the last eager case
            shown.update(f"verifying {name}: {event.stage.value} call {event.done} of {event.total}")
            return
        if isinstance(event, CaseResult):
            judged["calls"] += 1
            shown.update(f"verifying {name}: {event.stage.value} {event.case_id or event.dtype} {event.shape} "
                         f"#{event.trial}: "
                         f"{'ok' if event.ok else 'FAIL'} ({judged['calls']} calls judged)")
        if not args.json:
            shown.print(event.line(mode) if isinstance(event, CaseResult) else event.summary())

    return report
