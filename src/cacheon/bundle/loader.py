"""Importing a bundle's entry function, from its declared ``.py`` sources and nothing else.

Only ever called after ``scan`` admitted the bundle, and by the verifier only inside its sandboxed
child. It imports from a :class:`~cacheon.bundle.snapshot.Snapshot`, the bytes read once (and,
where the caller names the admitted digest, checked against it): nothing is read from disk at
import time. The bundle root is never put on ``sys.path``: a meta-path finder serves exactly the
manifest's declared sources, under a package private to that content, through a loader that
compiles the source bytes itself. No bytecode is read (a shipped ``.pyc`` or ``__pycache__`` is
never looked at) and none is written. A source may import its siblings relatively
(``from . import helper``) or by their top-level name (``import helper``); the latter is mapped
onto the bundle's own package, so two bundles in one process never see each other's modules.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

from cacheon.bundle.manifest import OpEntry, load_manifest
from cacheon.bundle.snapshot import Snapshot, read_snapshot
from cacheon.errors import UsageError

_real_import = builtins.__import__


def module_name(rel: str) -> str | None:
    """The dotted name of a declared source (``kernels/k.py`` → ``kernels.k``), None if its path
    is not made of identifiers (then it is importable only as an op source, not by siblings)."""
    parts = list(PurePosixPath(rel).parts)
    if not parts or not parts[-1].endswith(".py"):
        return None
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


class _SourceLoader(importlib.abc.Loader):
    """Compile and run one declared source's bytes; ``source`` None makes an empty package."""

    def __init__(self, source: tuple[str, bytes] | None, importer: Callable[..., ModuleType]) -> None:
        self.source = source  # (origin for tracebacks, the snapshot's bytes)
        self.importer = importer

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        scope = dict(vars(builtins))
        scope["__import__"] = self.importer
        module.__dict__["__builtins__"] = scope
        if self.source is None:
            return
        origin, data = self.source
        code = compile(data, origin, "exec", dont_inherit=True)
        exec(code, module.__dict__)


class BundleImporter(importlib.abc.MetaPathFinder):
    """Serves one bundle's declared sources as ``<prefix>.<dotted name>`` modules."""

    def __init__(self, snapshot: Snapshot, digest: str, declared: Iterable[str]) -> None:
        self.snapshot = snapshot
        self.prefix = "_cacheon_bundle_" + digest.removeprefix("sha256:")[:16]
        self.files: dict[str, tuple[str, bytes]] = {}
        packages: set[str] = set()
        with_init: set[str] = set()
        for rel in declared:
            name = module_name(rel)
            if name is None:
                continue
            self.files[name] = self._source(rel)
            parts = name.split(".")
            packages.update(".".join(parts[:i]) for i in range(1, len(parts)))
            if PurePosixPath(rel).name == "__init__.py":
                with_init.add(name)
        self.packages = frozenset(packages | with_init)
        self.packages_with_init = frozenset(with_init)
        self.roots = frozenset(name.split(".")[0] for name in self.files)

    def _source(self, rel: str) -> tuple[str, bytes]:
        return str(Path(self.snapshot.root) / rel), self.snapshot.files[rel]

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == self.prefix:
            local = ""
        elif fullname.startswith(self.prefix + "."):
            local = fullname[len(self.prefix) + 1 :]
        else:
            return None
        if local and local not in self.files and local not in self.packages:
            return None
        file = self.files.get(local) if local else None
        is_package = not local or local in self.packages
        spec = importlib.machinery.ModuleSpec(
            fullname, _SourceLoader(file, self.import_for_bundle), origin=file[0] if file else None,
            is_package=is_package,
        )
        spec.has_location = file is not None
        return spec

    def import_for_bundle(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: Sequence[str] = (),
        level: int = 0,
    ) -> ModuleType:
        """``__import__`` as the bundle's modules see it: their siblings' top-level names map onto
        the bundle's package; every other import is the interpreter's own."""
        top = name.split(".")[0]
        if level or top not in self.roots:
            return _real_import(name, globals, locals, fromlist, level)
        _real_import(f"{self.prefix}.{name}", globals, locals, fromlist, 0)
        return sys.modules[f"{self.prefix}.{name if fromlist else top}"]

    def import_source(self, rel: str) -> ModuleType:
        name = module_name(rel)
        if name is not None:
            return importlib.import_module(f"{self.prefix}.{name}")
        synthetic = f"{self.prefix}_source_{hashlib.sha256(rel.encode()).hexdigest()[:12]}"
        module = sys.modules.get(synthetic)
        if module is None:
            spec = importlib.util.spec_from_loader(synthetic, _SourceLoader(self._source(rel), self.import_for_bundle))
            assert spec is not None and spec.loader is not None  # spec_from_loader with a loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[synthetic] = module
            spec.loader.exec_module(module)
        return module


_importers: dict[str, BundleImporter] = {}


def _refuse_shadowing(importer: BundleImporter) -> None:
    """A bundle module named like an installed one (``numpy.py``) reads as the real module to a
    reviewer; refuse the ambiguity outright."""
    for name in sorted(importer.roots & (importer.files.keys() | importer.packages_with_init)):
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            raise UsageError(f"bundle module {name!r} shadows the installed module {name!r}; rename it")


def importer_for(bundle: Path | Snapshot, digest: str | None = None) -> BundleImporter:
    """The one importer of this bundle content in this process (installed on first use). A path is
    read into a snapshot first; with ``digest`` (the admitted one) other content is refused."""
    snapshot = bundle if isinstance(bundle, Snapshot) else read_snapshot(bundle)
    if digest is not None:
        snapshot.check(digest)
    actual = snapshot.require_digest()
    importer = _importers.get(actual)
    if importer is None:
        importer = BundleImporter(snapshot, actual, load_manifest(snapshot).declared_files())
        _refuse_shadowing(importer)
        sys.meta_path.insert(0, importer)
        _importers[actual] = importer
    return importer


def load_entry(
    bundle: Path | Snapshot, op: OpEntry, name: str | None = None, *, digest: str | None = None
) -> Callable[..., Any]:
    """Import ``op.source`` and return its function ``name`` (default: the op's entry; or its ``prepare``)."""
    module = importer_for(bundle, digest).import_source(op.source)
    name = name or op.entry
    function = getattr(module, name, None)
    if not callable(function):
        raise UsageError(f"{op.source}: has no callable {name!r} (named by the manifest for {op.slot})")
    return function  # type: ignore[no-any-return]  # callable() checked it; its signature is the bundle's
