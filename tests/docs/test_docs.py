"""The documentation cannot quietly drift from the code: links resolve, every command and scan rule
is documented, and the README starts with the two commands that work on a fresh machine."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from cacheon.bundle.scan import RULES
from cacheon.cli import COMMANDS
from tests.conftest import REPO

README = (REPO / "README.md").read_text()
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_starts_with_the_two_commands_and_stays_short():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in block] == [["make", "run"], ["make", "test"]]
    assert len(README.splitlines()) <= 200


def test_every_relative_link_in_the_readme_and_the_site_resolves():
    pages = [REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    broken = [
        f"{page.relative_to(REPO)} -> {target}"
        for page in pages
        for target in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()
    ]
    assert not broken, broken


def test_the_readme_names_every_command():
    table = README.split("| pillar | commands |", 1)[1].split("\n\n", 1)[0]
    assert set(re.findall(r"`([a-z-]+)`", table)) == set(COMMANDS)


def test_the_scan_page_explains_every_rule():
    page = (REPO / "docs" / "contributing" / "scan.md").read_text()
    assert not [rule for rule in RULES if f"| `{rule}` |" not in page]


def test_every_configuration_key_says_what_it_means():
    """The configuration reference is generated from the config types: a key without a description
    would be a row that says nothing."""
    from cacheon.gateway.config import GatewayConfig

    undescribed, queue, seen = [], [GatewayConfig], set()
    while queue:
        cls = queue.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for field in msgspec.inspect.type_info(cls).fields:
            t = field.type
            if not (isinstance(t, msgspec.inspect.Metadata) and (t.extra_json_schema or {}).get("description")):
                undescribed.append(f"{cls.__name__}.{field.name}")
            t = getattr(t, "type", t)
            for sub in (t, *getattr(t, "types", ()), getattr(t, "item_type", None), getattr(t, "value_type", None)):
                if isinstance(sub, (msgspec.inspect.StructType, msgspec.inspect.DataclassType)):
                    queue.append(sub.cls)
    assert len(seen) >= 6 and not undescribed, undescribed


# Names the docs give for Cacheon's own code: a path under one of the repository's top directories
# or packages, `path.py Name[.member]`, `cacheon.module[.Name]`, and private classes such as `_Relay`.
_TOPS = ("src", "scripts", "tests", "benchmarks", "deploy", "examples", "docs", "cacheon",
         *(p.name for p in (REPO / "src" / "cacheon").iterdir() if p.is_dir() and not p.name.startswith("_")))
_PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(_TOPS)})/(?:[\w-]+/)*[\w-]+\.(?:py|sh))\b")
_PAIR = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py) ([A-Z_][A-Za-z0-9_]*)(?:\.([a-z_][a-z0-9_]*))?")
_DOTTED = re.compile(r"`(cacheon(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
_PRIVATE_CLASS = re.compile(r"(?<![\w.])(_[A-Z][A-Za-z0-9]+)\b")


def _source(path: str) -> Path | None:
    """A path as the docs write it: from the repository root, from src/, or inside the package."""
    return next((base / path for base in (REPO, REPO / "src", REPO / "src" / "cacheon") if (base / path).is_file()),
                None)


def _names(module: Path) -> dict[str, set[str]]:
    """A module's top-level names (classes, functions, assignments, imports), each with its members."""
    import ast

    names: dict[str, set[str]] = {}
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            members |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target,
                                                                                                       ast.Name)}
            names[node.name] = members
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names[target.id] = set()
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update({(a.asname or a.name): set() for a in node.names})
    return names


def _dotted_resolves(dotted: str) -> bool | None:
    """``cacheon.a.b.Name``: True when it names a module or a module's attribute; None when it is not a
    module path at all (a logger or attribute name such as ``cacheon.access``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        base = REPO / "src" / Path(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest, names = parts[cut:], _names(module)
            return not rest or (rest[0] in names and (len(rest) == 1 or rest[1] in names[rest[0]]))
    return None


def test_the_module_and_class_names_the_docs_give_exist():
    import ast

    trees = [ast.parse(f.read_text()) for f in (REPO / "src").rglob("*.py")]
    nodes = [n for tree in trees for n in ast.walk(tree)]
    defined = {n.name for n in nodes if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)}
    # dotted strings the code writes (a digest's domain such as cacheon.bundle.v1) are not module paths
    literals = {v for n in nodes if isinstance(n, ast.Constant) and isinstance(v := n.value, str | bytes)}
    written = {(v.decode(errors="replace") if isinstance(v, bytes) else v).rstrip("\0") for v in literals}
    stale = []
    for page in [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]:
        if not page.is_file():
            continue
        text, where = page.read_text(), page.relative_to(REPO)
        stale += [f"{where}: {p}" for p in sorted(set(_PATH.findall(text))) if _source(p) is None]
        for path, name, member in sorted(set(_PAIR.findall(text))):
            module = _source(path)
            names = _names(module) if module is not None and module.suffix == ".py" else None
            if names is not None and (name not in names or (member and member not in names[name])):
                stale.append(f"{where}: {path} {name}{'.' + member if member else ''}")
        stale += [f"{where}: {d}" for d in sorted(set(_DOTTED.findall(text)))
                  if d not in written and _dotted_resolves(d) is False]
        stale += [f"{where}: {n}" for n in sorted(set(_PRIVATE_CLASS.findall(text))) if n not in defined]
    assert not stale, stale
