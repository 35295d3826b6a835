"""``cacheon verify``: prove a bundle computes its slots, its code confined in a sandbox."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cacheon.bundle.admission import admit
from cacheon.bundle.archive import open_bundle
from cacheon.commands._output import print_json
from cacheon.contract.catalog import FLOAT_DTYPES
from cacheon.contract.profiles import get_profile
from cacheon.evidence.classes import EvidenceClass, bundle_subject
from cacheon.evidence.record import add_record_arguments, record_from_cli
from cacheon.verify.plan import Confinement, VerifyOptions, draw_seed
from cacheon.verify.report import CaseResult, StageResult, VerifyReport
from cacheon.verify.runner import verify_bundle
from cacheon.verify.sandbox import require_bubblewrap

EXIT = {"PASS": 0, "NUMERICAL_PASS": 0, "FAIL": 2}


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
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the candidate runs (default cpu)")
    p.add_argument(
        "--dtype", action="append", choices=FLOAT_DTYPES, default=[], help="restrict to this dtype (repeatable)"
    )
    p.add_argument("--seed", type=int, default=None, help="run seed for every draw (shapes, input statistics, "
                   "poison, stability order); default: drawn from OS entropy and printed, so --seed reproduces it")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one kernel call may take before the "
                   "candidate's sandbox is killed (default 120)")
    p.add_argument("--graph-replays", type=int, default=3, help="poisoned CUDA-graph replays per case (cuda only)")
    p.add_argument("--stability-calls", type=int, default=1000, metavar="N",
                   help="calls of the stability stage per op, a random subset judged (default 1000; 0 skips it)")
    p.add_argument("--keep-going", action="store_true", help="run every case even after a failure "
                   "(default: stop an op at its first failing case)")
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="ranks for collective slots (default 2; gloo on cpu, nccl with one GPU per rank on cuda)")
    p.add_argument("--model", default=None, metavar="KEY",
                   help="judge against a model profile's specialisation of the slots (e.g. gpt-oss)")
    p.add_argument("--confinement", choices=[c.value for c in Confinement], default=Confinement.BUBBLEWRAP.value,
                   help="bubblewrap (default; verify refuses to run when it is unavailable) or none: run the "
                   "candidate as a plain child process; its evidence is marked unconfined and never counts "
                   "where confined evidence is required")
    p.add_argument("--debug", action="store_true", help="also print tracebacks from the candidate's process")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    add_record_arguments(p, control=True)
    p.set_defaults(handler=run)


def _progress(mode: str, event: CaseResult | StageResult) -> None:
    print(event.line(mode) if isinstance(event, CaseResult) else event.summary(), flush=True)


def _print_summary(report: VerifyReport, debug: bool) -> None:
    if "model_profile" in report.environment:
        print(f"model profile: {report.environment['model_profile']}")
    for op in report.ops:
        print(f"{op.slot} ({op.source}:{op.entry}): {op.verdict} - {op.reason}")
        if debug and op.detail:
            print("  traceback from the candidate's process (untrusted):\n    "
                  + op.detail.strip().replace("\n", "\n    "))
        if op.candidate_output:
            print("  candidate output (untrusted):\n    " + op.candidate_output.strip().replace("\n", "\n    "))
    print(f"confinement: {report.confinement}   seed: {report.seed} (--seed {report.seed} reproduces this run)")
    print(f"{report.verdict}  {report.bundle_id} {report.bundle_digest}")


def run(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else draw_seed()
    confinement = Confinement(args.confinement)
    options = VerifyOptions(
        device=args.device, dtypes=tuple(args.dtype), seed=seed, timeout=args.timeout,
        graph_replays=args.graph_replays, keep_going=args.keep_going, world_size=args.world_size,
        profile=get_profile(args.model) if args.model else None, confinement=confinement,
        stability_calls=max(0, args.stability_calls),
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
            # a tree with a symlink has no digest: the record then names the bundle by its manifest id
            named = admission.manifest.bundle_id
            subject = bundle_subject(admission.digest) if admission.digest else f"bundle-id:{named}"
            record_from_cli(args, evidence_class=EvidenceClass.COMPONENT, subject=subject, exit_code=2, details=details)
            return 2
        assert admission.digest is not None  # an admitted tree has no symlink, so it has a digest
        if confinement is Confinement.BUBBLEWRAP:
            require_bubblewrap()  # refuse before anything is printed or run
        if not args.json:
            print(f"verifying {admission.manifest.bundle_id} {admission.digest} on {args.device} "
                  f"(confinement {confinement.value}, seed {seed})", flush=True)
        report = verify_bundle(root, admission.manifest, admission.digest, options, None if args.json else _progress)
    if args.json:
        print_json(report.to_json(debug=args.debug))
    else:
        _print_summary(report, args.debug)
    code = EXIT[report.verdict]
    record_from_cli(args, evidence_class=EvidenceClass.COMPONENT, subject=bundle_subject(report.bundle_digest),
                    exit_code=code, details={**report.to_json(), "confinement": report.confinement})
    return code
