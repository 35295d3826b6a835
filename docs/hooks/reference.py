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

import msgspec

from cacheon.bundle.kernel_language import allowlist
from cacheon.bundle.scan import RULES
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


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _described(t: msgspec.inspect.Type) -> tuple[msgspec.inspect.Type, str]:
    """A field's type without its ``Meta`` wrapper, and the description it carries."""
    if isinstance(t, msgspec.inspect.Metadata):
        return t.type, str((t.extra_json_schema or {}).get("description", ""))
    return t, ""


def _type_name(t: msgspec.inspect.Type) -> str:
    """A config type as a reader writes it, with its bounds."""
    t = _described(t)[0]
    match t:
        case msgspec.inspect.UnionType():
            named = [_type_name(x) for x in t.types if not isinstance(x, msgspec.inspect.NoneType)]
            return " or ".join(named) + (" or null" if len(named) < len(t.types) else "")
        case msgspec.inspect.LiteralType():
            return " \\| ".join(f"`{v}`" for v in t.values)
        case msgspec.inspect.ListType():
            return f"list of {_type_name(t.item_type)}"
        case msgspec.inspect.DictType():
            return f"map of {_type_name(t.key_type)} to {_type_name(t.value_type)}"
        case msgspec.inspect.StructType() | msgspec.inspect.DataclassType():
            return f"`{t.cls.__name__}`"
        case msgspec.inspect.IntType() | msgspec.inspect.FloatType():
            bounds = [f"{op} {v}" for op, v in (("≥", t.ge), ("≤", t.le), (">", t.gt), ("<", t.lt)) if v is not None]
            return ("int" if isinstance(t, msgspec.inspect.IntType) else "number") + (
                f" ({', '.join(bounds)})" if bounds else "")
    return type(t).__name__.removesuffix("Type").lower()


def _structs(t: msgspec.inspect.Type) -> Iterator[type]:
    """The struct types a field's type holds (directly, in a union, a list or a map)."""
    t = _described(t)[0]
    for sub in (t, *getattr(t, "types", ()), getattr(t, "item_type", None), getattr(t, "value_type", None)):
        if isinstance(sub, (msgspec.inspect.StructType, msgspec.inspect.DataclassType)):
            yield sub.cls


def configuration_reference() -> str:
    """Every key of the gateway's config file, from the msgspec types the file is decoded into."""
    from cacheon.gateway.config import ENV_PREFIX, GatewayConfig

    lines: list[str] = []
    seen: set[type] = set()
    queue: list[tuple[type, str]] = [(GatewayConfig, "")]
    while queue:
        cls, path = queue.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, (msgspec.inspect.StructType, msgspec.inspect.DataclassType))
        lines += [f"## `{path or 'top level'}` ({cls.__name__})", "", (cls.__doc__ or "").strip(), "",
                  "| key | type | default | meaning | environment |", "|---|---|---|---|---|"]
        for field in info.fields:
            key = f"{path}.{field.name}" if path else field.name
            bare, meaning = _described(field.type)
            if field.required:
                default = "*required*"
            elif field.default is not msgspec.NODEFAULT:
                default = f"`{msgspec.json.encode(field.default).decode()}`"
            else:
                default = "`[]`" if isinstance(bare, msgspec.inspect.ListType) else "`{}`"
            env = f"`{ENV_PREFIX}{key.upper().replace('.', '__')}`" if "[" not in key else ""
            lines.append(f"| `{field.name}` | {_type_name(bare)} | {default} | {_cell(meaning)} | {env} |")
            for sub in _structs(bare):
                suffix = "[]" if isinstance(bare, msgspec.inspect.ListType) else (
                    ".NAME" if isinstance(bare, msgspec.inspect.DictType) else "")
                queue.append((sub, key + suffix))
        lines.append("")
    return "\n".join(lines)


def scan_rules_reference() -> str:
    """Every rule id the scan reports, then the kernel language's allowed surface (from the allow-list itself)."""
    lines = ["| rule | what it refuses |", "|---|---|"]
    lines += [f"| `{rule}` | {_cell(what)} |" for rule, what in RULES.items()]
    modules = ", ".join(f"`{m}`" for m in sorted(allowlist.MODULES))
    lines += ["", "## Allowed surface", "", f"Importable modules: {modules}, and the bundle's own declared modules.",
              "", "| module | members |", "|---|---|"]
    for module, members in allowlist.MEMBERS.items():
        lines.append(f"| `{module}` | {', '.join(f'`{m}`' for m in sorted(members))} |")

    def names(title: str, values: frozenset[str]) -> list[str]:
        return ["", f"**{title}:** " + ", ".join(f"`{v}`" for v in sorted(values))]

    lines += names("Decorators (on the bundle's top-level functions)", allowlist.DECORATORS)
    lines += names("Builtins", allowlist.BUILTINS)
    lines += names("Builtins in annotations", allowlist.ANNOTATION_BUILTINS)
    lines += names("Attributes of a tensor (or any untracked value)", allowlist.TENSOR_ATTRS)
    lines += names("Attributes of the other values a kernel holds", allowlist.OBJECT_ATTRS)
    lines += names("Inside `@triton.jit`: builtins", allowlist.JIT_BUILTINS)
    lines += names("Inside `@triton.jit`: attributes of values", allowlist.JIT_ATTRS)
    return "\n".join(lines) + "\n"


def state_of_record_page() -> str:
    """The committed ledger, verified first: a broken chain fails the build instead of being shown."""
    if not RECORDS.exists():
        return "No ledger of record is committed yet (`scripts/record_state.sh` makes one): nothing is proven.\n"
    return state_of_record(open_verified_ledger(RECORDS)).to_markdown()


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "configuration": configuration_reference,
    "scan-rules": scan_rules_reference,
    "state-of-record": state_of_record_page,
}


def on_page_markdown(markdown: str, **_: object) -> str:
    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(f"unknown generated section {name!r}; known: {', '.join(sorted(GENERATORS))}")
        return GENERATORS[name]()

    return MARKER.sub(expand, markdown)
