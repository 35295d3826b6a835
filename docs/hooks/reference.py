"""MkDocs hook: pages generated from the code, so the documentation cannot drift from it.

A page holds a marker such as ``<!-- generated: cli -->``; at build time the marker is replaced by
what the named generator renders from the live definitions (the argparse parsers of every
command, ...). ``mkdocs build --strict`` fails on an unknown marker.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from cacheon.cli import COMMANDS, build_parser
from cacheon.evidence.ledger import open_verified_ledger
from cacheon.evidence.state import state_of_record

#: the project's own ledger of record (``scripts/record_state.sh`` appends to it)
RECORDS = Path(__file__).resolve().parents[2] / "records" / "ledger.sqlite3"

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _option_row(action: argparse.Action) -> str:
    if action.option_strings:
        name = ", ".join(f"`{s}`" for s in action.option_strings)
        if action.nargs != 0:
            name += f" `{action.metavar or action.dest.upper()}`"
    else:
        name = f"`{action.metavar or action.dest}`"
    text = (action.help or "").replace("|", "\\|").replace("\n", " ")
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        text += f" (one of: {', '.join(f'`{c}`' for c in action.choices)})"
    if action.default not in (None, False, [], argparse.SUPPRESS) and "default" not in text:
        text += f" (default: `{action.default}`)"
    return f"| {name} | {text} |"


def _render(path: str, parser: argparse.ArgumentParser, depth: int, summary: str = "") -> list[str]:
    lines = [f"{'#' * depth} `{path}`", ""]
    if parser.description or summary:
        lines += [parser.description or summary, ""]
    lines += ["```", parser.format_usage().strip(), "```", ""]
    rows = [
        _option_row(a)
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]
    if rows:
        lines += ["| argument | meaning |", "|---|---|", *rows, ""]
    if parser.epilog:
        lines += [parser.epilog, ""]
    helps = {a.dest: a.help for a in parser._actions if isinstance(a, argparse._SubParsersAction)
             for a in a._choices_actions}
    for name, child in _subparsers(parser):
        lines += _render(f"{path} {name}", child, min(depth + 1, 6), helps.get(name) or "")
    return lines


def cli_reference() -> str:
    """Every command and subcommand with its usage and every argument, in ``cacheon --help`` order."""
    lines = []
    for command, (_module, summary) in COMMANDS.items():
        parser = dict(_subparsers(build_parser(command)))[command]
        lines += _render(f"cacheon {command}", parser, 2, summary)
    return "\n".join(lines)


def state_of_record_page() -> str:
    """The committed ledger, verified first: a broken chain fails the build instead of being shown."""
    if not RECORDS.exists():
        return "No ledger of record is committed yet (`scripts/record_state.sh` makes one): nothing is proven.\n"
    return state_of_record(open_verified_ledger(RECORDS)).to_markdown()


GENERATORS: dict[str, Callable[[], str]] = {"cli": cli_reference, "state-of-record": state_of_record_page}


def on_page_markdown(markdown: str, **_: object) -> str:
    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(f"unknown generated section {name!r}; known: {', '.join(sorted(GENERATORS))}")
        return GENERATORS[name]()

    return MARKER.sub(expand, markdown)
