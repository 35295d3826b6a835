"""``cacheon package``: a byte-for-byte deterministic archive of a bundle."""

from __future__ import annotations

import argparse
from pathlib import Path

from cacheon.bundle.archive import write_archive


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "package",
        help="write a deterministic .tar.gz of a bundle and print its digest",
        description="Validate BUNDLE's manifest and write a deterministic .tar.gz (sorted members, zeroed "
        "times and owners): the same content always gives the same bytes. Prints the bundle content digest.",
    )
    p.add_argument("bundle", type=Path, help="bundle directory")
    p.add_argument("--out", type=Path, required=True, help="archive path to write (e.g. bundle.tar.gz)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    digest = write_archive(args.bundle, args.out)
    print(f"{digest}  {args.out}")
    return 0
