"""The ``cacheon`` command line: thin. Each command lives in ``cacheon.commands.<name>``.

A command module exposes ``register(subparsers)``, which adds its parser and sets
``handler=<function(args) -> int>``. User mistakes raise :class:`CacheonError` and become a
one-line message and exit 1, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from cacheon import __version__
from cacheon.errors import CacheonError

# One line per command module; order is the order in ``--help``.
COMMAND_MODULES = (
    "cacheon.commands.slots",
    "cacheon.commands.scan",
    "cacheon.commands.verify",
    "cacheon.commands.package",
    "cacheon.commands.identity",
    "cacheon.commands.preflight",
    "cacheon.commands.evidence",
    "cacheon.commands.pin",
    "cacheon.commands.release",
    "cacheon.commands.kv",
)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error; here 2 means "checked and failed", so use 1."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cacheon",
        description="Cacheon: slots, bundles and verification for an exact SGLang runtime.",
        epilog="Exit codes: 0 success, 2 checked and failed (violations, FAIL, drift), 1 unusable input "
        "or infrastructure error.",
    )
    parser.add_argument("--version", action="version", version=f"cacheon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 1
    try:
        return int(handler(args))
    except CacheonError as exc:
        print(f"cacheon {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
