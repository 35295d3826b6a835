"""``scan_bundle`` end to end on bundles built in tmp_path: the tree policy and the report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cacheon.bundle import snapshot, tree_policy
from cacheon.bundle.scan import RULES, Finding, ScanReport, scan_bundle
from cacheon.errors import UsageError

KERNEL = "import torch\n\n\ndef silu_and_mul(x, out):\n    out.copy_(torch.nn.functional.silu(x))\n"


def make_bundle(root: Path, files: dict[str, str | bytes]) -> tuple[str, ...]:
    """Write a bundle (manifest plus ``files``) and return its declared paths: all of ``files``."""
    for rel, content in {"manifest.toml": 'bundle_id = "b"\n', **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return ("manifest.toml", *files)


def scan(root: Path, declared: tuple[str, ...]) -> set[tuple[str, int, str]]:
    report = scan_bundle(root, declared)
    assert {f.rule for f in report.findings} <= RULES.keys()
    return {(f.file, f.line, f.rule) for f in report.findings}


def test_clean_bundle(tmp_path: Path):
    declared = make_bundle(tmp_path, {"kernels/silu.py": KERNEL, "kernels/util.py": "import math\n"})
    report = scan_bundle(tmp_path, declared)
    assert report.clean and report.findings == ()
    assert report.files_scanned == 3
    assert report.to_json() == {"clean": True, "files_scanned": 3, "findings": []}


def test_ast_findings_name_file_and_line(tmp_path: Path):
    declared = make_bundle(tmp_path, {"kernels/silu.py": KERNEL + "import os\nos.system('id')\n"})
    report = scan_bundle(tmp_path, declared)
    assert [str(f) for f in report.findings] == [
        "kernels/silu.py:6: [not-allowed-import] os is not importable by a kernel "
        "(allowed surface: docs/contributing/scan.md#the-kernel-language)",
    ]
    assert not report.clean


def test_syntax_error_is_a_finding(tmp_path: Path):
    declared = make_bundle(tmp_path, {"k.py": "x = 1\ndef (:\n"})
    assert scan(tmp_path, declared) == {("k.py", 2, "syntax-error")}


def test_symlinks_are_reported_and_not_followed(tmp_path: Path):
    outside = tmp_path / "outside"
    make_bundle(outside, {"evil.py": "import subprocess\n"})
    bundle = tmp_path / "bundle"
    declared = make_bundle(bundle, {"k.py": KERNEL})
    (bundle / "linked_dir").symlink_to(outside, target_is_directory=True)
    (bundle / "linked.py").symlink_to(outside / "evil.py")
    assert scan(bundle, (*declared, "linked.py")) == {
        ("linked.py", 0, "symlink"),
        ("linked.py", 0, "missing-file"),
        ("linked_dir", 0, "symlink"),
    }


def test_binaries_by_content_and_extension(tmp_path: Path):
    files = {
        "k.py": KERNEL,
        "lib.so": "text, but a shared-object name",
        "blob.dat": b"ab\x00cd",
        "l1.txt": b"\xff",
    }
    assert scan(tmp_path, make_bundle(tmp_path, files)) == {
        ("blob.dat", 0, "binary-file"),
        ("l1.txt", 0, "binary-file"),
        ("lib.so", 0, "binary-file"),
    }


def test_binary_python_file_is_not_parsed(tmp_path: Path):
    assert scan(tmp_path, make_bundle(tmp_path, {"k.py": b"import os\x00"})) == {("k.py", 0, "binary-file")}


@pytest.mark.parametrize("name", ["kernel.ptx", "kernel.cubin", "k.fatbin", "k.hsaco"])
def test_precompiled_kernels(tmp_path: Path, name: str):
    declared = make_bundle(tmp_path, {name: ".version 8.0\n.target sm_90\n"})
    assert scan(tmp_path, declared) == {(name, 0, "precompiled-artifact")}


def test_undeclared_files_except_root_metadata(tmp_path: Path):
    declared = make_bundle(tmp_path, {"k.py": KERNEL})
    extra = [
        "README.md",
        "LICENSE",
        "LICENSE-APACHE",
        "NOTICE.txt",
        "CHANGELOG.rst",
        "notes.txt",
        "sub/README",
    ]
    for rel in extra:
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text("text\n")
    assert scan(tmp_path, declared) == {
        ("notes.txt", 0, "undeclared-file"),
        ("sub/README", 0, "undeclared-file"),
    }


def test_undeclared_python_is_still_parsed(tmp_path: Path):
    declared = make_bundle(tmp_path, {"k.py": KERNEL})
    (tmp_path / "hidden.py").write_text("import math\nimport socket\n")
    assert scan(tmp_path, declared) == {("hidden.py", 0, "undeclared-file"), ("hidden.py", 2, "not-allowed-import")}


def test_bytecode_is_a_finding(tmp_path: Path):
    """Never skipped: a __pycache__ directory or a .pyc anywhere refuses the bundle."""
    declared = make_bundle(tmp_path, {"k.py": KERNEL})
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "k.cpython-311.pyc").write_bytes(b"\x00\x01")
    (tmp_path / "stale.pyc").write_bytes(b"\x00")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "old.pyo").write_bytes(b"\x00")
    assert scan(tmp_path, declared) == {
        ("__pycache__", 0, "bytecode"),
        ("stale.pyc", 0, "bytecode"),
        ("sub/old.pyo", 0, "bytecode"),
    }


def test_oversized_file(tmp_path: Path):
    big = "x = 0\n" * (tree_policy.MAX_FILE_BYTES // 6 + 1)
    assert scan(tmp_path, make_bundle(tmp_path, {"k.py": big})) == {("k.py", 0, "oversized-file")}


def test_missing_declared_file(tmp_path: Path):
    declared = make_bundle(tmp_path, {"k.py": KERNEL})
    assert scan(tmp_path, (*declared, "gone.py")) == {("gone.py", 0, "missing-file")}


def test_fifo_is_reported_without_blocking(tmp_path: Path):
    declared = make_bundle(tmp_path, {"k.py": KERNEL})
    os.mkfifo(tmp_path / "pipe")
    assert scan(tmp_path, declared) == {("pipe", 0, "special-file")}


def test_unprintable_file_name(tmp_path: Path):
    declared = make_bundle(tmp_path, {"k.py": KERNEL})
    (tmp_path / "evil\n.py").write_text("import os\n")
    assert scan(tmp_path, declared) == {("evil\\n.py", 0, "bad-filename")}


def test_findings_are_sorted_and_deterministic(tmp_path: Path):
    files = {"b.py": "import os\nimport socket\n", "a.py": "eval('1')\nimport os\n", "z.bin": b"\x00"}
    declared = make_bundle(tmp_path, files)
    first, second = scan_bundle(tmp_path, declared), scan_bundle(tmp_path, reversed(declared))
    assert first == second
    assert list(first.findings) == sorted(first.findings)
    assert [f.file for f in first.findings] == ["a.py", "a.py", "b.py", "b.py", "z.bin"]
    payload = json.loads(json.dumps(first.to_json()))
    assert payload["findings"][0] == {
        "file": "a.py",
        "line": 1,
        "rule": "not-allowed-name",
        "message": "eval is not a builtin of the kernel language, nor bound by this source "
        "(allowed surface: docs/contributing/scan.md#the-kernel-language)",
    }


def test_report_types():
    finding = Finding("k.py", 3, "pickle", "torch.load")
    report = ScanReport((finding,), 1)
    assert not report.clean and str(finding) == "k.py:3: [pickle] torch.load"
    with pytest.raises(AttributeError):
        report.files_scanned = 2  # type: ignore[misc]


def test_not_a_directory_is_unusable_input(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    for root in (tmp_path / "file", tmp_path / "absent"):
        with pytest.raises(UsageError):
            scan_bundle(root, ["manifest.toml"])


def test_unreadable_directory_is_unusable_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    declared = make_bundle(tmp_path, {"sub/k.py": KERNEL})
    real_scandir = os.scandir

    def scandir(fd: int):  # the walk lists directories by descriptor; as root, chmod 000 does not stop it
        if os.readlink(f"/proc/self/fd/{fd}").endswith("sub"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(fd)

    monkeypatch.setattr(snapshot.os, "scandir", scandir)
    with pytest.raises(UsageError, match="sub"):
        scan_bundle(tmp_path, declared)
