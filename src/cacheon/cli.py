"""The ``cacheon`` command line: thin. Each command lives in ``cacheon.commands.<name>``.

A command module exposes ``register(subparsers)``, which adds its parser and sets
``handler=<function(args) -> int>``. User mistakes raise :class:`CacheonError` and become a
one-line message and exit 1, never a traceback; so do environment problems (``OSError``) and,
with a request to report it, bugs. ``--debug`` shows the traceback. Output piped into a reader
that stops early (``| head``) ends quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback
from typing import Any, NoReturn

from cacheon import __version__
from cacheon.commands._args import HelpFormatter
from cacheon.errors import CacheonError, UsageError, did_you_mean

# command -> (module, one-line summary). Only the chosen command's module is imported, so
# `cacheon slots` does not pay for the gateway's or the ledger's imports. Order = order in --help.
# The module's register(subparsers) must add a parser with exactly this command name.
COMMANDS: dict[str, tuple[str, str]] = {
    "slots": ("cacheon.commands.slots", "list the registered slots and their ABI"),
    "scan": ("cacheon.commands.scan", "statically admit a bundle (AST and file-tree policy)"),
    "verify": ("cacheon.commands.verify", "verify a bundle against the trusted float64 references"),
    "serve": ("cacheon.commands.serve", "serve SGLang with a bundle armed, confined as verify confines candidates"),
    "new": ("cacheon.commands.new", "write a starter bundle for a slot (manifest and a plain torch kernel)"),
    "package": ("cacheon.commands.package", "write a deterministic .tar.gz of a bundle and print its digest"),
    "bundle": ("cacheon.commands.bundle", "sign bundles so anyone can verify them (OpenSSF model-signing format)"),
    "identity": ("cacheon.commands.identity", "capture this host's runtime identity and its digest"),
    "preflight": ("cacheon.commands.preflight", "device readiness, static compatibility, what is left to prove"),
    "evidence": ("cacheon.commands.evidence", "read the evidence ledger for an exact runtime identity"),
    "pin": ("cacheon.commands.pin", "pin-bump gates: what is proven for a pin's exact identity"),
    "release": ("cacheon.commands.release", "build, sign and verify Engine release descriptors"),
    "kv": ("cacheon.commands.kv", "SGLang KV-event wire: listen, predict block hashes, list contracts"),
    "gateway": ("cacheon.commands.gateway", "OpenAI-compatible KV-aware router in front of SGLang workers"),
    "sim": ("cacheon.commands.sim", "SIMULATED SGLang workers for demos and tests (no model, no GPU)"),
    "demo": ("cacheon.commands.demo", "run simulated workers and the gateway; compare rr, approx, exact"),
    "compat": ("cacheon.commands.compat", "check the installed SGLang against the pin and every seam"),
    "chain-compat": ("cacheon.commands.chain_compat", "check the installed Bittensor SDK against its pin"),
}


#: packages a command may need that the wheel does not install, and how to install each
OPTIONAL = {
    "torch": "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (the CPU build; "
             "or the CUDA build for your GPU)",
    "triton": "pip install triton==3.9.0",
    "nats": "pip install 'cacheon[fleet]' (nats-py, for the event plane)",
}


def _missing(command: str | None, exc: ModuleNotFoundError) -> CacheonError | None:
    """A command that needs a package the wheel leaves out (torch): one line saying what to install."""
    top = (exc.name or "").partition(".")[0]
    if top not in OPTIONAL:
        return None
    return UsageError(f"{top} is not installed; `cacheon {command}` needs it: {OPTIONAL[top]}")


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error; here 2 means "checked and failed", so use 1. Every
    parser's help shows each option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}{self._suggestion(message)}\n")

    def _suggestion(self, message: str) -> str:
        """A close match for a mistyped command, choice or option (argparse's own wording parsed)."""
        choice = re.match(r"argument .*: invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        if choice:
            return did_you_mean(choice[1], re.findall(r"'([^']*)'", choice[2]))
        unknown = re.match(r"unrecognized arguments: (-[-\w]+)", message)
        if unknown:
            return did_you_mean(unknown[1].partition("=")[0], [o for a in self._actions for o in a.option_strings])
        return ""


def _selected(argv: list[str]) -> str | None:
    """The command named on the command line (the first word that is a command), if any."""
    return next((word for word in argv if word in COMMANDS), None)


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cacheon",
        description="Cacheon: slots, bundles and verification for an exact SGLang runtime.",
        epilog="Exit codes: 0 success, 2 checked and failed (violations, FAIL, drift), 1 unusable input "
        "or infrastructure error.",
    )
    parser.add_argument("--version", action="version", version=f"cacheon {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (module, summary) in COMMANDS.items():
        if name == selected:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    selected = _selected(argv)
    try:
        parser = build_parser(selected)
    except ModuleNotFoundError as exc:  # the command's module needs a package the wheel leaves out
        missing = _missing(selected, exc)
        if missing is None:
            raise
        return _one_line(selected or "", missing, debug=False)
    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the command's own parser, so its usage line is the one shown
        _leaf(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 1
    try:
        code = int(handler(args))
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
        return code
    except BrokenPipeError:
        return _reader_went_away()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        return _one_line(args.command, exc, args.debug)


def _leaf(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` chose: ``cacheon evidence list``'s, not ``cacheon``'s."""
    while True:
        chooser = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, chooser.dest, None) if chooser is not None else None
        if chooser is None or chosen not in chooser.choices:
            return parser
        parser = chooser.choices[chosen]


def _one_line(command: str, exc: Exception, debug: bool) -> int:
    """A user mistake or an environment problem in one line; anything else is a bug to report."""
    if isinstance(exc, ModuleNotFoundError):
        exc = _missing(command, exc) or exc
    if isinstance(exc, CacheonError):
        print(f"cacheon {command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        print(f"cacheon {command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    hint = "" if debug else "; rerun with --debug for the traceback"
    print(f"cacheon {command}: internal error: {type(exc).__name__}: {exc}{hint} (please report it)", file=sys.stderr)
    return 1


def _reader_went_away() -> int:
    """stdout's reader closed early (``cacheon ... | head``): stop quietly, as Unix tools do."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not raise again
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
