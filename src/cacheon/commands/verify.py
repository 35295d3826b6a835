"""``cacheon verify``: prove a bundle computes its slots, in an isolated child process."""

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
from cacheon.verify.report import CaseResult, OpReport, VerifyReport
from cacheon.verify.runner import VerifyOptions, verify_bundle

EXIT = {"PASS": 0, "NUMERICAL_PASS": 0, "FAIL": 2}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="verify a bundle against the trusted float64 references",
        description="Scan BUNDLE, then run each op in an isolated child process over every registered shape "
        "(plus seeded token jitter), dtype and two trials, judging outputs in this process against a float64 "
        "reference. Verdicts: PASS; FAIL; NUMERICAL_PASS when numerics match but the required CUDA-graph "
        "proof could not run (CPU). Exit 0 PASS/NUMERICAL_PASS, 2 FAIL (or scan violations), 1 infrastructure "
        "error or unusable input.",
    )
    p.add_argument("bundle", type=Path, help="bundle directory or .tar.gz archive")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the candidate runs (default cpu)")
    p.add_argument(
        "--dtype", action="append", choices=FLOAT_DTYPES, default=[], help="restrict to this dtype (repeatable)"
    )
    p.add_argument("--seed", type=int, default=0, help="base seed for inputs and jitter (default 0)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one kernel call may take before the "
                   "candidate process is killed (default 120)")
    p.add_argument("--graph-replays", type=int, default=3, help="poisoned CUDA-graph replays per case (cuda only)")
    p.add_argument("--keep-going", action="store_true", help="run every case even after a failure "
                   "(default: stop an op at its first failing case)")
    p.add_argument("--world-size", type=int, default=None, metavar="N",
                   help="ranks for collective slots (default 2; gloo on cpu, nccl with one GPU per rank on cuda)")
    p.add_argument("--model", default=None, metavar="KEY",
                   help="judge against a model profile's specialisation of the slots (e.g. gpt-oss)")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")
    add_record_arguments(p, control=True)
    p.set_defaults(handler=run)


def _progress(op: OpReport, case: CaseResult) -> None:
    print(case.line(op.mode), flush=True)


def _print_summary(report: VerifyReport) -> None:
    if "model_profile" in report.environment:
        print(f"model profile: {report.environment['model_profile']}")
    for op in report.ops:
        print(f"{op.slot} ({op.source}:{op.entry}): {op.verdict} - {op.reason}")
        if op.detail:
            print("  " + op.detail.strip().replace("\n", "\n  "))
        if op.candidate_output:
            print("  candidate output (untrusted):\n    " + op.candidate_output.strip().replace("\n", "\n    "))
    print(f"{report.verdict}  {report.bundle_id} {report.bundle_digest}")


def run(args: argparse.Namespace) -> int:
    options = VerifyOptions(
        device=args.device, dtypes=tuple(args.dtype), seed=args.seed, timeout=args.timeout,
        graph_replays=args.graph_replays, keep_going=args.keep_going, world_size=args.world_size,
        profile=get_profile(args.model) if args.model else None,
    )
    with open_bundle(args.bundle) as root:
        admission = admit(root)
        if not admission.admitted:
            for f in admission.scan.findings:
                print(f, file=sys.stderr)
            print(f"FAIL  {admission.manifest.bundle_id}: scan found {len(admission.scan.findings)} violation(s); "
                  "the bundle was not executed", file=sys.stderr)
            if args.json:
                print_json({"verdict": "FAIL", "reason": "scan violations", "bundle_digest": admission.digest,
                            "scan": admission.scan.to_json()})
            record_from_cli(args, evidence_class=EvidenceClass.COMPONENT, subject=bundle_subject(admission.digest),
                            exit_code=2, details={"verdict": "FAIL", "reason": "scan violations"})
            return 2
        if not args.json:
            print(f"verifying {admission.manifest.bundle_id} {admission.digest} on {args.device}", flush=True)
        progress = None if args.json else _progress
        report = verify_bundle(root, admission.manifest, admission.digest, options, progress)
    if args.json:
        print_json(report.to_json())
    else:
        _print_summary(report)
    code = EXIT[report.verdict]
    record_from_cli(args, evidence_class=EvidenceClass.COMPONENT, subject=bundle_subject(report.bundle_digest),
                    exit_code=code, details=report.to_json())
    return code
