#!/usr/bin/env python3
"""Weekly SGLang check for CI (or cron): newer release on the index? installed SGLang still the pin, and
every seam still there?

Prints GitHub Actions annotations (``::warning``/``::error``) and the canary table. Exit 0 when nothing is
an error (a newer release and an unreachable index are warnings; SGLang not importable means seam
coverage skipped, a warning); 2 when the installed SGLang differs from the pin or a seam FAILs.
The index URL is ``$CACHEON_SGLANG_INDEX_URL`` (default: PyPI's JSON API for sglang).

Without GitHub Actions, run it from cron, e.g. Mondays 09:00 UTC:
    0 9 * * 1  cd /path/to/cacheon && .venv/bin/python scripts/check_sglang.py >>check_sglang.log 2>&1
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # run from a checkout, installed or not

from cacheon.runtime.canary import run_canary
from cacheon.runtime.pin import SGLANG_DIST, SGLANG_PIN
from cacheon.runtime.release_check import (
    annotation,
    canary_findings,
    exit_code,
    index_url,
    latest_release,
    release_finding,
)
from cacheon.runtime.seams import SEAMS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="check_sglang.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--index-url", default=index_url(),
                        help="PyPI-style JSON API document for sglang (default: $CACHEON_SGLANG_INDEX_URL, else "
                        "PyPI's: %(default)s)")
    try:
        url = parser.parse_args(argv).index_url
    except SystemExit as stop:  # --help is 0; a usage error is 1 here, since 2 means the pin drifted
        return 0 if stop.code == 0 else 1
    findings = [release_finding(SGLANG_PIN, lambda: latest_release(url))]
    with contextlib.redirect_stdout(sys.stderr):  # SGLang's import-time chatter is not an annotation
        report = run_canary(SGLANG_DIST, SGLANG_PIN, SEAMS)
    findings += canary_findings(report)
    for finding in findings:
        print(annotation(finding))
    print("\n".join(report.lines()))
    return exit_code(findings)


if __name__ == "__main__":
    raise SystemExit(main())
