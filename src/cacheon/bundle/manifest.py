"""``manifest.toml``: strict parsing. Unknown keys, wrong types and bad paths are errors that name
the key and the file, because a typo that silently disables an op is worse than a refusal."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cacheon.bundle.paths import check_relative
from cacheon.bundle.snapshot import Snapshot, read_snapshot
from cacheon.contract.catalog import ABI_VERSION, SLOTS
from cacheon.errors import UsageError, did_you_mean

MANIFEST_NAME = "manifest.toml"
_BUNDLE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOP_KEYS = {"bundle_id", "abi_version", "description", "include", "ops"}
_OP_KEYS = {"slot", "source", "entry", "dtypes", "prepare"}


@dataclass(frozen=True)
class OpEntry:
    slot: str
    source: str
    entry: str
    dtypes: tuple[str, ...]
    prepare: str | None = None  # entry run once on raw weights, for slots that declare prepare inputs


@dataclass(frozen=True)
class Manifest:
    bundle_id: str
    abi_version: str
    description: str
    ops: tuple[OpEntry, ...]
    include: tuple[str, ...]

    def declared_files(self) -> tuple[str, ...]:
        """Every file the manifest vouches for: itself, each op source, each include."""
        names = {MANIFEST_NAME, *(op.source for op in self.ops), *self.include}
        return tuple(sorted(names))


class ManifestError(UsageError):
    pass


def valid_bundle_id(text: str) -> bool:
    """Whether ``text`` may name a bundle (lowercase letters, digits, ``.``, ``_``, ``-``; 64 at most)."""
    return bool(_BUNDLE_ID.fullmatch(text))


def load_manifest(bundle: Path | Snapshot) -> Manifest:
    """The manifest of a bundle snapshot (a path is read into one first): its paths must name
    regular files of that same snapshot, so the manifest and the files it vouches for are one read."""
    snapshot = bundle if isinstance(bundle, Snapshot) else read_snapshot(bundle)
    path = Path(snapshot.root) / MANIFEST_NAME
    data = snapshot.files.get(MANIFEST_NAME)
    if data is None:
        raise ManifestError(f"{path}: missing {MANIFEST_NAME} (a bundle is a directory with a manifest)")
    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: not valid TOML: {exc}") from None
    return _parse(parsed, snapshot, path)


def _fail(path: Path, key: str, message: str) -> ManifestError:
    return ManifestError(f"{path}: {key}: {message}")


def _string(data: dict[str, Any], key: str, path: Path, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        kind = "missing" if value is None else f"must be a string, got {type(value).__name__}"
        raise _fail(path, where + key, kind)
    return value


def _string_list(value: Any, path: Path, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, where, "must be a list of strings")
    return tuple(value)


def _unknown(data: dict[str, Any], allowed: set[str], path: Path, where: str) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise _fail(path, where + extra[0],
                    f"unknown key (allowed: {', '.join(sorted(allowed))}){did_you_mean(extra[0], allowed)}")


def _declared_path(snapshot: Snapshot, text: str, path: Path, where: str) -> str:
    rel = check_relative(text, f"{path}: {where}").as_posix()
    if rel not in snapshot.files:
        hit = snapshot.refusal(rel)
        if hit is None:
            raise UsageError(f"{path}: {where}: {rel} does not exist in bundle {snapshot.root}")
        how = "goes through a symlink" if hit[1] == "symlink" else f"is refused ({hit[1]})"
        raise UsageError(f"{path}: {where}: {rel} {how} ({hit[0]})")
    return rel


def _parse(data: dict[str, Any], snapshot: Snapshot, path: Path) -> Manifest:
    _unknown(data, _TOP_KEYS, path, "")
    bundle_id = _string(data, "bundle_id", path, "")
    if not _BUNDLE_ID.match(bundle_id):
        raise _fail(path, "bundle_id", f"{bundle_id!r} must match {_BUNDLE_ID.pattern}")
    abi = _string(data, "abi_version", path, "")
    if abi != ABI_VERSION:
        raise _fail(path, "abi_version", f"{abi!r} is not supported (this Cacheon speaks {ABI_VERSION!r})")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(path, "description", "must be a string")
    include = tuple(
        _declared_path(snapshot, p, path, f"include[{i}]")
        for i, p in enumerate(_string_list(data.get("include", []), path, "include"))
    )
    raw_ops = data.get("ops")
    if not isinstance(raw_ops, list) or not raw_ops or not all(isinstance(o, dict) for o in raw_ops):
        raise _fail(path, "ops", "must be a non-empty array of tables ([[ops]])")
    ops = tuple(_parse_op(op, i, snapshot, path) for i, op in enumerate(raw_ops))
    slots = [op.slot for op in ops]
    duplicated = sorted({s for s in slots if slots.count(s) > 1})
    if duplicated:
        raise _fail(path, "ops", f"slot {duplicated[0]!r} is implemented more than once")
    return Manifest(bundle_id, abi, description, ops, include)


def _parse_op(op: dict[str, Any], i: int, snapshot: Snapshot, path: Path) -> OpEntry:
    where = f"ops[{i}]."
    _unknown(op, _OP_KEYS, path, where)
    slot = _string(op, "slot", path, where)
    if slot not in SLOTS:
        raise _fail(path, where + "slot",
                    f"unknown slot {slot!r} (registered: {', '.join(sorted(SLOTS))}){did_you_mean(slot, SLOTS)}")
    source = _string(op, "source", path, where)
    if not source.endswith(".py"):
        raise _fail(path, where + "source", f"{source!r} must be a Python source file (.py)")
    source = _declared_path(snapshot, source, path, where + "source")
    entry = _string(op, "entry", path, where)
    if not _IDENTIFIER.match(entry):
        raise _fail(path, where + "entry", f"{entry!r} is not a Python identifier")
    prepare = _prepare_entry(op, SLOTS[slot].prepare_inputs, path, where)
    dtypes = _string_list(op.get("dtypes", []), path, where + "dtypes")
    allowed = SLOTS[slot].dtypes
    for dtype in dtypes:
        if dtype not in allowed:
            raise _fail(path, where + "dtypes", f"{dtype!r} is not a dtype of {slot} ({', '.join(allowed)})")
    return OpEntry(slot, source, entry, dtypes or allowed, prepare)


def _prepare_entry(op: dict[str, Any], prepare_inputs: tuple[str, ...], path: Path, where: str) -> str | None:
    slot = op["slot"]
    if not prepare_inputs:
        if "prepare" in op:
            raise _fail(path, where + "prepare", f"{slot} has no prepare step")
        return None
    name = _string(op, "prepare", path, where)
    if not _IDENTIFIER.match(name):
        raise _fail(path, where + "prepare", f"{name!r} is not a Python identifier")
    return name
