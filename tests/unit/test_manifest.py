import os
from pathlib import Path

import pytest

from cacheon.bundle.manifest import load_manifest
from cacheon.errors import UsageError

GOOD = """
bundle_id = "demo"
abi_version = "cacheon-op-abi-v1"
[[ops]]
slot = "activation.silu_and_mul"
source = "kernels/k.py"
entry = "silu_and_mul"
"""


def make(tmp_path: Path, manifest: str, files=("kernels/k.py",)) -> Path:
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("def silu_and_mul(x, out):\n    pass\n")
    (tmp_path / "manifest.toml").write_text(manifest)
    return tmp_path


def test_good_manifest(tmp_path):
    m = load_manifest(make(tmp_path, GOOD))
    assert m.bundle_id == "demo" and m.ops[0].dtypes == ("float32", "bfloat16", "float16")
    assert m.declared_files() == ("kernels/k.py", "manifest.toml")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s + 'colour = "red"\n', "colour: unknown key"),
        (lambda s: s.replace('entry = "silu_and_mul"', 'entry = "silu_and_mul"\nspeed = 3'), r"ops\[0\].speed: unknown key"),
        (lambda s: s.replace('bundle_id = "demo"', "bundle_id = 3"), "bundle_id: must be a string, got int"),
        (lambda s: s.replace('abi_version = "cacheon-op-abi-v1"', 'abi_version = "v0"'), "abi_version: 'v0' is not supported"),
        (lambda s: s.replace("kernels/k.py", "kernels/missing.py"), r"ops\[0\].source: kernels/missing.py does not exist"),
        (lambda s: s.replace("kernels/k.py", "/etc/passwd.py"), "is absolute"),
        (lambda s: s.replace("kernels/k.py", "../k.py"), "escapes the bundle"),
        (lambda s: s.replace("activation.silu_and_mul", "activation.gelu"), "unknown slot 'activation.gelu'"),
        (lambda s: s.replace('entry = "silu_and_mul"', 'entry = "silu_and_mul"\ndtypes = ["float64"]'), "'float64' is not a dtype"),
        (lambda s: s.replace('entry = "silu_and_mul"', 'entry = "a b"'), "not a Python identifier"),
        (lambda s: s + GOOD.split("\n", 3)[3], "implemented more than once"),
        (lambda s: s.replace("[[ops]]", "[ops]"), "ops: must be a non-empty array of tables"),
        (lambda s: s + "[[", "not valid TOML"),
    ],
)
def test_bad_manifests_name_the_key_and_file(tmp_path, edit, message):
    root = make(tmp_path, edit(GOOD))
    with pytest.raises(UsageError, match=message) as info:
        load_manifest(root)
    assert "manifest.toml" in str(info.value)


def test_symlinked_source_is_refused(tmp_path):
    root = make(tmp_path, GOOD.replace("kernels/k.py", "kernels/link.py"))
    os.symlink(root / "kernels" / "k.py", root / "kernels" / "link.py")
    with pytest.raises(UsageError, match="symlink"):
        load_manifest(root)


def test_missing_manifest(tmp_path):
    with pytest.raises(UsageError, match=r"missing manifest\.toml"):
        load_manifest(tmp_path)
