#!/usr/bin/env python3
"""Re-record the conformance kit (tests/fixtures/engines/) from real SGLang servers on this CPU.

For each release (default: every one in scripts/engines/releases.toml) and page size 1 and 16, starts
a real server from its venv (scripts/install_sglang_servers.py), runs the fixed KV-event scenario of
tests/engines/captures.py and writes what it published. One server at a time; each is stopped
before the next starts. Run it with the project venv: ``.venv/bin/python scripts/record_engine_captures.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engines import kit  # noqa: E402
from tests.engines.conftest import EnginePool  # noqa: E402
from tests.engines.server import RELEASES, EngineSpec, missing_prerequisite  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("releases", nargs="*", metavar="RELEASE", help=f"default: {' '.join(RELEASES)}")
    parser.add_argument("--page-size", type=int, action="append", choices=kit.PAGE_SIZES, help="default: 1 and 16")
    args = parser.parse_args(argv)
    releases = args.releases or list(RELEASES)
    for release in releases:
        if release not in RELEASES:
            print(f"record_engine_captures: unknown release {release} (known: {', '.join(RELEASES)})", file=sys.stderr)
            return 1
        reason = missing_prerequisite(release)
        if reason:
            print(f"record_engine_captures: {reason}", file=sys.stderr)
            return 1
    root = Path(tempfile.mkdtemp(prefix="cacheon-kit-"))
    pool = EnginePool(root)
    try:
        for release in releases:
            for page_size in args.page_size or kit.PAGE_SIZES:
                spec = EngineSpec(release, page_size)
                print(f"{spec.label}: starting a real server ...", flush=True)
                server = pool.get(spec)
                path = kit.write(kit.record(server))
                pool.release(spec)
                print(f"{spec.label}: wrote {path.relative_to(ROOT)} (start-up {server.startup_s:.0f} s)", flush=True)
    finally:
        pool.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
