"""The bundle importer: declared sources only, compiled from their text, private to each bundle."""

import importlib.util
import py_compile
import sys
from pathlib import Path

import pytest
import torch

from cacheon.bundle.loader import importer_for, load_entry
from cacheon.bundle.manifest import OpEntry

MANIFEST = 'bundle_id = "b"\nabi_version = "cacheon-op-abi-v1"\ninclude = [{include}]\n[[ops]]\n' \
           'slot = "activation.silu_and_mul"\nsource = "kernels/k.py"\nentry = "f"\n'
OP = OpEntry("activation.silu_and_mul", "kernels/k.py", "f", ("float32",))


def bundle(root: Path, files: dict[str, str], include: tuple[str, ...] = ()) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "manifest.toml").write_text(MANIFEST.format(include=", ".join(f'"{p}"' for p in include)))
    return root


def test_bytecode_beside_or_in_pycache_is_never_read(tmp_path):
    root = bundle(tmp_path, {"kernels/k.py": "def f():\n    return 'source'\n"})
    evil = tmp_path / "evil.py"
    evil.write_text("def f():\n    return 'bytecode'\n")
    source = root / "kernels" / "k.py"
    for target in (Path(importlib.util.cache_from_source(str(source))), root / "kernels" / "k.pyc"):
        py_compile.compile(str(evil), cfile=str(target), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    before = sorted(p.name for p in (root / "kernels" / "__pycache__").iterdir())
    assert load_entry(root, OP)() == "source"
    assert sorted(p.name for p in (root / "kernels" / "__pycache__").iterdir()) == before  # nothing written


def test_only_declared_sources_import_and_the_root_is_never_on_sys_path(tmp_path):
    files = {"kernels/k.py": "from . import helper\nimport util\n\n\ndef f():\n    return helper.X + util.Y\n",
             "kernels/helper.py": "X = 1\n", "util.py": "Y = 2\n", "kernels/stray.py": "Z = 3\n"}
    root = bundle(tmp_path, files, include=("kernels/helper.py", "util.py"))
    assert load_entry(root, OP)() == 3
    assert str(root) not in sys.path and "util" not in sys.modules  # mapped onto the bundle's own package
    importer = importer_for(root)
    with pytest.raises(ModuleNotFoundError):
        importer.import_source("kernels/stray.py")  # on disk, but not declared


def test_two_bundles_with_the_same_module_names_stay_apart(tmp_path):
    a = bundle(tmp_path / "a", {"kernels/k.py": "def f():\n    return torch.ones(1)\n\n\nimport torch\n"})
    b = bundle(tmp_path / "b", {"kernels/k.py": "def f():\n    return 'b'\n"})
    assert torch.equal(load_entry(a, OP)(), torch.ones(1)) and load_entry(b, OP)() == "b"
