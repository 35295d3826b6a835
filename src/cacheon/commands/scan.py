"""``cacheon scan``: static admission of a bundle (nothing from the bundle is executed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cacheon.bundle.admission import admit
from cacheon.bundle.archive import open_bundle
from cacheon.commands._output import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scan",
        help="statically admit a bundle (AST and file-tree policy)",
        description="Check BUNDLE (a directory or .tar.gz) without running it: the manifest (each entry must be "
        "a top-level function of its source), an AST policy over every .py file (imports, the torch/triton "
        "allow-list, names matched by every path they resolve to, type comments, dunder definitions, foreign "
        "attribute assignment, format-string walks) and a policy over the file tree (no binaries, no "
        "bytecode, no links, nothing undeclared). Defense in depth: the sandbox of `verify` is the guard. "
        "Exit 0 clean, 2 violations, 1 unusable input (including a manifest entry its source does not define).",
    )
    p.add_argument("bundle", type=Path, help="bundle directory or .tar.gz archive")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with open_bundle(args.bundle) as root:
        admission = admit(root)
    report = admission.scan
    if args.json:
        print_json(
            {
                "bundle": str(args.bundle),
                "bundle_id": admission.manifest.bundle_id,
                "bundle_digest": admission.digest,
                **report.to_json(),
            }
        )
    else:
        for f in report.findings:
            print(f)
        verdict = "clean" if report.clean else f"{len(report.findings)} violation(s)"
        digest = admission.digest or "(no digest: the tree holds an entry the snapshot refuses)"
        print(f"{admission.manifest.bundle_id} {digest}: {report.files_scanned} file(s) scanned, {verdict}")
    admission.require_usable_manifest(args.bundle)
    return 0 if report.clean else 2
