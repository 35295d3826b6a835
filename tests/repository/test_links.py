"""No committed symbolic link points outside the repository (issue 24: a link to a development
machine's worktree dangled in every fresh clone). The repository commits none: a corpus bundle that
carries a link gets it at run time (tests/cli/test_adversarial.py ``LINKED``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO

LINK_MODE = "120000"


def committed_links(root: Path) -> list[str]:
    """Every path git records as a symbolic link (mode 120000)."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-s", "-z"], capture_output=True, check=True).stdout
    entries = (entry.decode().split("\t", 1) for entry in listed.split(b"\0") if entry)
    return sorted(path for meta, path in entries if meta.split()[0] == LINK_MODE)


def escaping_links(root: Path) -> list[str]:
    """The committed links whose target, resolved through every link on the way, is not in the tree."""
    top = Path(os.path.realpath(root))
    return [path for path in committed_links(root) if not Path(os.path.realpath(root / path)).is_relative_to(top)]


def test_no_committed_link_points_outside_the_tree() -> None:
    assert escaping_links(REPO) == [] and committed_links(REPO) == []


def test_the_check_finds_absolute_relative_and_chained_escapes(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "sub" / "file").write_text("x")
    links = {"inside": "sub/file", "itself": ".", "absolute": "/work/wt/elsewhere", "up": "../outside",
             # lexically "." (d/sub/../..), but d is the root itself, so it resolves to the root's parent
             "chained": "itself/sub/../.."}
    for name, target in links.items():
        (repo / name).symlink_to(target)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    assert committed_links(repo) == sorted(links)
    assert escaping_links(repo) == ["absolute", "chained", "up"]
