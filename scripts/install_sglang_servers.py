#!/usr/bin/env python3
"""Install one virtualenv per SGLang release that can run ``python -m sglang.launch_server`` on this CPU.

Why not ``pip install sglang==X``: each release's metadata pins a CUDA torch and dozens of CUDA-only
packages. A server venv holds instead: CPU torch (``torch==2.13.0``) and triton, ``sglang==X --no-deps``,
the release's import closure frozen in ``scripts/engines/sglang-<X>.lock`` (installed ``--no-deps``:
no resolver run, the same versions on every machine), the named stand-ins the release needs
(scripts/standins/build_wheel.py; only where a CUDA-only package has no CPU build), and Cacheon
itself (editable, no deps), whose ``sglang.srt.plugins`` entry point arms bundles inside the server.
What each release needs is in ``scripts/engines/releases.toml``.

Idempotent: a venv whose stamp matches what would be installed is left alone (a metadata check,
well under a second). ``--relock`` re-resolves a release's closure (its own Requires-Dist pins,
torch held fixed) in a scratch venv and rewrites its lock file; run it when adding a release.

Usage: scripts/install_sglang_servers.py [--dir .engines] [--relock] [--check] [RELEASE ...]
Env:   CACHEON_ENGINES_DIR (default .engines)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ROOT / "scripts" / "engines"
RELEASES_TOML = ENGINES / "releases.toml"
STANDINS = ROOT / "scripts" / "standins"
STAMP = ".cacheon-engine.json"
DIR_ENV = "CACHEON_ENGINES_DIR"
# Imported once after an install: the server's entry points and the plugin Cacheon arms through.
SMOKE = (
    "import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, "
    "sglang.srt.managers.detokenizer_manager, cacheon.runtime.plugin, cacheon.runtime.identity"
)
# Never part of a lock: installed explicitly, or not a package of the closure.
UNLOCKED = {"torch", "triton", "sglang", "cacheon", "pip", "setuptools", "wheel"}

sys.path.insert(0, str(STANDINS))
import build_wheel  # noqa: E402  (scripts/standins/build_wheel.py: the one stand-in builder)


class InstallError(Exception):
    pass


def load_table() -> dict:
    return tomllib.loads(RELEASES_TOML.read_text(encoding="utf-8"))


def lock_path(release: str) -> Path:
    return ENGINES / f"sglang-{release}.lock"


def engines_dir(explicit: str | None) -> Path:
    path = Path(explicit or os.environ.get(DIR_ENV) or ROOT / ".engines")
    return path if path.is_absolute() else ROOT / path


def wanted_digest(table: dict, release: str) -> str:
    """What a finished venv for ``release`` is made of; a change reinstalls it."""
    entry = table["releases"][release]
    sha = hashlib.sha256()
    for part in (
        release,
        table["torch"],
        table["triton"],
        lock_path(release).read_text(encoding="utf-8"),
        json.dumps(entry, sort_keys=True),
        build_wheel.source_digest(entry["standins"]),
    ):
        sha.update(part.encode() + b"\0")
    return sha.hexdigest()


def pip(python: Path, *args: str, what: str) -> None:
    """Run pip quietly; on failure show its output and stop."""
    command = [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        noise = "is ignored: it is neither a file nor a directory"
        lines = [line for line in (done.stdout + done.stderr).splitlines() if noise not in line]
        raise InstallError(f"{what} failed:\n" + "\n".join(lines[-40:]))


def make_venv(path: Path, table: dict) -> Path:
    if path.exists():
        shutil.rmtree(path)
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    pip(python, "install", table["torch"], table["triton"], what="CPU torch and triton")
    return python


def install_standins(python: Path, names: list[str], work: Path) -> None:
    wheels = [str(build_wheel.build(name, work)) for name in names]
    pip(python, "install", "--no-deps", "--force-reinstall", *wheels, what="stand-ins " + ", ".join(names))


def install(release: str, target: Path, table: dict) -> None:
    lock = lock_path(release)
    if not lock.is_file():
        raise InstallError(f"no lock for {release} ({lock}); make one with --relock {release}")
    (target / STAMP).unlink(missing_ok=True)  # no stamp until the venv is complete
    python = make_venv(target, table)
    with tempfile.TemporaryDirectory() as work:
        pip(python, "install", "--no-deps", f"sglang=={release}", what=f"sglang {release}")
        pip(python, "install", "--no-deps", "-r", str(lock), what=f"the {release} closure ({lock.name})")
        install_standins(python, table["releases"][release]["standins"], Path(work))
    pip(python, "install", "--no-deps", "-e", str(ROOT), what="cacheon (editable)")
    smoke = subprocess.run([str(python), "-W", "ignore", "-c", SMOKE], capture_output=True, text=True)
    if smoke.returncode != 0:
        raise InstallError(f"sglang {release} is installed but its server does not import:\n{smoke.stderr[-3000:]}")
    (target / STAMP).write_text(json.dumps({"release": release, "digest": wanted_digest(table, release)}) + "\n")


def relock(release: str, table: dict) -> None:
    """Resolve the closure afresh (the release's own pins, torch held fixed) and write its lock."""
    with tempfile.TemporaryDirectory() as scratch:
        python = make_venv(Path(scratch) / "venv", table)
        pip(python, "install", "--no-deps", f"sglang=={release}", "packaging", what=f"sglang {release}")
        specs = subprocess.run(
            [str(python), "-c", _SPECS, *table["closure"]], capture_output=True, text=True, check=True
        ).stdout.split()
        constraints = Path(scratch) / "constraints.txt"
        constraints.write_text(f"{table['torch']}\n{table['triton']}\n")
        install_standins(python, table["releases"][release]["standins"], Path(scratch))
        pip(python, "install", "-c", str(constraints), *specs, what=f"resolving the {release} closure")
        freeze = [str(python), "-m", "pip", "freeze", "--disable-pip-version-check"]
        frozen = subprocess.run(freeze, capture_output=True, text=True, check=True).stdout
    standins = {n.replace("_", "-") for n in table["releases"][release]["standins"]}
    lines = []
    for line in frozen.splitlines():
        name = line.split("==")[0].split(" @ ")[0].strip().lower().replace("_", "-")
        if "==" in line and name not in UNLOCKED and name not in standins:
            lines.append(line.strip())
    header = (
        f"# The import closure of an SGLang {release} CPU server, frozen by\n"
        f"# scripts/install_sglang_servers.py --relock {release} (installed --no-deps; do not edit by hand).\n"
    )
    lock_path(release).write_text(header + "\n".join(sorted(lines, key=str.lower)) + "\n", encoding="utf-8")
    print(f"{release}: wrote {lock_path(release).relative_to(ROOT)} ({len(lines)} packages)")


# Run inside the scratch venv: the closure's names with the release's own version specifiers.
_SPECS = """
import sys, importlib.metadata as md
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
pins = {}
for text in md.requires("sglang") or []:
    req = Requirement(text)
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        pins[canonicalize_name(req.name)] = req
for name in sys.argv[1:]:
    req = pins.get(canonicalize_name(name))
    print(f"{name}{req.specifier}" if req is not None else name)
"""


# From 0.5.18 SGLang hashes KV blocks in a C++ extension it compiles on first use (torch
# cpp_extension, g++, ninja, OpenSSL). Built here, into the venv's own directory, so a missing
# compiler fails the install with a clear message instead of a server's first request.
_NATIVE_HASH = (
    "from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module as load; "
    "from array import array; "
    "print(load().get_hash(array('I', [1, 2]), 2, 1, False, None, 1)[0])"
)


def ensure_native_hash(target: Path) -> None:
    python = target / "bin" / "python"
    site = next((target / "lib").glob("python3*/site-packages"))
    if not (site / "sglang" / "srt" / "mem_cache" / "cpp_utils" / "native_hash.py").is_file():
        return  # this release hashes in Python
    extensions = target / "torch_extensions"
    if list(extensions.glob("*/*.so")):
        return
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    started = time.monotonic()
    done = subprocess.run([str(python), "-W", "ignore", "-c", _NATIVE_HASH], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise InstallError(
            "SGLang's native hash extension (mem_cache/cpp_utils/hash_binding.cpp) does not build here; "
            f"it needs g++, ninja and the OpenSSL headers (apt: g++ ninja-build libssl-dev):\n{done.stderr[-2000:]}"
        )
    print(f"{target.name}: built the native hash extension in {time.monotonic() - started:.0f} s", flush=True)


def current(target: Path, table: dict, release: str) -> bool:
    try:
        stamp = json.loads((target / STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stamp.get("digest") == wanted_digest(table, release) and (target / "bin" / "python").exists()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("releases", nargs="*", metavar="RELEASE", help="default: every release in releases.toml")
    parser.add_argument("--dir", help=f"where the venvs go (default ${DIR_ENV}, else .engines)")
    parser.add_argument("--relock", action="store_true", help="re-resolve each release's closure into its lock first")
    parser.add_argument("--check", action="store_true", help="only report whether each venv is current (exit 1 if not)")
    args = parser.parse_args(argv)
    table = load_table()
    releases = args.releases or list(table["releases"])
    unknown = [r for r in releases if r not in table["releases"]]
    if unknown:
        print(f"install_sglang_servers: unknown release {', '.join(unknown)} "
              f"(known: {', '.join(table['releases'])})", file=sys.stderr)
        return 1
    base = engines_dir(args.dir)
    stale = []
    for release in releases:
        target = base / release
        try:
            if args.relock:
                relock(release, table)
            if current(target, table, release):
                if not args.check:
                    ensure_native_hash(target)
                print(f"sglang {release}: server venv current in {target}")
                continue
            if args.check:
                stale.append(release)
                print(f"sglang {release}: server venv missing or stale in {target}")
                continue
            print(f"sglang {release}: installing a server venv into {target} ...", flush=True)
            started = time.monotonic()
            install(release, target, table)
            ensure_native_hash(target)
            print(f"sglang {release}: ready in {time.monotonic() - started:.0f} s", flush=True)
        except InstallError as exc:
            print(f"install_sglang_servers: {exc}", file=sys.stderr)
            return 1
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
