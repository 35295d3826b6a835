"""``cacheon package``: a byte-for-byte deterministic archive of a bundle that passes ``scan``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cacheon.bundle.admission import admit
from cacheon.bundle.archive import write_archive
from cacheon.commands._files import new_path, written_whole
from cacheon.commands._output import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "package",
        help="write a deterministic .tar.gz of a bundle and print its digest",
        description="Scan BUNDLE and write a deterministic .tar.gz (sorted members, zeroed times and owners): "
        "the same content always gives the same bytes. Prints the bundle content digest. A bundle with scan "
        "violations is not packaged (exit 2, the findings on stderr); an existing archive is kept unless "
        "--force, and the archive's directory must exist. Exit 1 for unusable input.",
    )
    p.add_argument("bundle", type=Path, help="bundle directory")
    p.add_argument("--out", type=Path, required=True, help="archive path to write (e.g. bundle.tar.gz)")
    p.add_argument("--force", action="store_true", help="replace an existing archive at --out")
    p.add_argument("--json", action="store_true", help="print {archive, bundle_id, bundle_digest, bytes} as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    out = new_path(args.out, force=args.force)
    admission = admit(args.bundle)
    admission.require_usable_manifest(args.bundle)
    if not admission.admitted:
        for finding in admission.scan.findings:
            print(finding, file=sys.stderr)
        print(f"cacheon package: {admission.manifest.bundle_id}: scan found {len(admission.scan.findings)} "
              f"violation(s); nothing written", file=sys.stderr)
        return 2
    with written_whole(out) as temporary:
        digest = write_archive(admission.snapshot, temporary)  # the scanned bytes, not a second read
    if args.json:
        print_json({"archive": str(out), "bundle_id": admission.manifest.bundle_id, "bundle_digest": digest,
                    "bytes": out.stat().st_size})
    else:
        print(f"{digest}  {out}")
    return 0
