"""``cacheon new SLOT DIR``: a starter bundle that passes ``scan`` and ``verify`` as written."""

from __future__ import annotations

import argparse
from pathlib import Path

from cacheon.bundle.admission import admit
from cacheon.bundle.manifest import valid_bundle_id
from cacheon.commands._files import existing_parent
from cacheon.commands._output import print_json
from cacheon.errors import UsageError
from cacheon.starters import starter, write


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "new",
        help="write a starter bundle for a slot: a manifest and a plain torch kernel that passes",
        description="Create DIR with a manifest for SLOT and a plain torch kernel that passes `cacheon scan` and "
        "`cacheon verify` as written, so the first run is green; then replace the kernel's body with your own. "
        "`cacheon slots` lists the slots. DIR's parent must exist; an existing non-empty DIR is refused unless "
        "--force, which rewrites only the starter's two files. Exit 0 written, 1 unusable input.",
    )
    p.add_argument("slot", metavar="SLOT", help="a registered slot, e.g. activation.silu_and_mul")
    p.add_argument("directory", type=Path, metavar="DIR", help="the bundle directory to create")
    p.add_argument("--bundle-id", metavar="ID", help="the manifest's bundle_id (default: DIR's name)")
    p.add_argument("--force", action="store_true", help="write into an existing non-empty DIR")
    p.add_argument("--json", action="store_true", help="print {bundle, bundle_id, slot, files, bundle_digest}")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    start = starter(args.slot)
    directory: Path = args.directory
    bundle_id = args.bundle_id or directory.resolve().name
    if not valid_bundle_id(bundle_id):
        hint = "" if args.bundle_id else " (it is DIR's name: pass --bundle-id)"
        raise UsageError(f"bundle id {bundle_id!r}{hint} must be lowercase letters, digits, '.', '_' or '-', "
                         "at most 64, starting with a letter or digit")
    existing_parent(directory, option="DIR")
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"DIR {directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()) and not args.force:
        raise UsageError(f"DIR {directory} exists and is not empty; add --force to write the starter's files into it")
    directory.mkdir(exist_ok=True)
    written = write(start, directory, bundle_id)
    admission = admit(directory)
    if args.json:
        print_json({"bundle": str(directory), "bundle_id": bundle_id, "slot": start.slot.name,
                    "files": [str(p) for p in written], "bundle_digest": admission.digest})
        return 0
    print(f"wrote a starter bundle for {start.slot.name} in {directory} ({admission.digest}):")
    for path in written:
        print(f"  {path}")
    print(f"  {start.slot.signature()}: {start.slot.summary}")
    if not admission.admitted:  # --force into a directory with other files: say so now, not at verify
        print(f"note: the scan refuses other files in {directory} ({admission.scan.findings[0]}); "
              "`cacheon scan` lists them")
    print(f"next: cacheon scan {directory} && cacheon verify {directory}")
    return 0
