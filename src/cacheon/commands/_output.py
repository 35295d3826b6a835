"""How commands talk to machines and users, the same way everywhere: JSON on stdout, subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def print_json(value: Any, *, line: bool = False) -> None:
    """Every ``--json``: one indented document with sorted keys, or with ``line`` one compact record per
    line, in its own field order, flushed at once (a stream a reader follows)."""
    if line:
        sys.stdout.write(json.dumps(value) + "\n")
        sys.stdout.flush()
        return
    json.dump(value, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def add_subcommands(parser: argparse.ArgumentParser, dest: str,
                    metavar: str = "SUBCOMMAND") -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """``parser``'s subcommands; naming none is a usage error like any other (usage line, exit 1)."""
    return parser.add_subparsers(dest=dest, metavar=metavar, required=True, parser_class=type(parser))


def print_keys(private_path: Any, public_path: Any, key_id: str, *, as_json: bool) -> None:
    """What every keygen command prints: both paths and the key id a verifier will see."""
    if as_json:
        print_json({"private_key": str(private_path), "public_key": str(public_path), "key_id": key_id})
    else:
        print(f"private key {private_path} (mode 600; keep it secret)")
        print(f"public key  {public_path}: key id {key_id}")
