"""Where the simulator finds the SGLang releases it publishes with, and how it installs one.

The simulator loads only a release's ``kv_events`` module (and the few pure-Python modules it
imports) from that release's unpacked wheel, one directory per version, so releases sit side by
side without installing an engine. The directory is, in order: ``--releases-dir``;
``$SGLANG_RELEASES_DIR``; ``./.sglang`` when it holds releases (a development checkout, laid out
by scripts/install_sglang_releases.sh); else a per-user cache (``$XDG_CACHE_HOME`` or ``~/.cache``,
then ``cacheon/sglang-releases``), so an installed wheel works from any directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from cacheon.errors import UsageError

ENV = "SGLANG_RELEASES_DIR"
CHECKOUT = Path(".sglang")


def user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cacheon" / "sglang-releases"


def default_dir() -> Path:
    """The releases directory when none is given (see the module docstring for the order)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    if CHECKOUT.is_dir() and any(CHECKOUT.glob("*/sglang/srt/disaggregation/kv_events.py")):
        return CHECKOUT
    return user_cache()


def unpacked(root: Path, version: str) -> bool:
    return (root / version / "sglang" / "srt" / "disaggregation" / "kv_events.py").is_file()


def how_to_get(root: Path, version: str) -> str:
    """The one line that says how to get a missing release."""
    return f"SGLang {version} is not unpacked under {root}: run `cacheon sim install-releases {version} " \
           f"--releases-dir {root}`"


def install(root: Path, version: str) -> Path:
    """Unpack ``sglang==version`` (its wheel alone, no dependencies) into ``root/version``; idempotent."""
    target = root / version
    if unpacked(root, version):
        return target
    partial = root / f"{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-deps", "--no-compile", "--target", str(partial), f"sglang=={version}"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        last = (run.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise UsageError(f"cannot install SGLang {version} into {root}: {last}")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target
