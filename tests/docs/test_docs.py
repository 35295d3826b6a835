"""The documentation cannot quietly drift from the code: links resolve, every command and scan rule
is documented, and the README starts with the two commands that work on a fresh machine."""

from __future__ import annotations

import re

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
