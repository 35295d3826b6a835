"""What the tamper check costs a reader: open_verified_ledger (read every row in one snapshot,
recompute every hash, check every link and identity) against a raw SELECT of the same rows.

usage: python benchmarks/ledger_verify.py [RECORDS] [REPEATS]
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cacheon.evidence.classes import EvidenceClass, Outcome
from cacheon.evidence.ledger import Entry, Ledger, open_verified_ledger
from cacheon.runtime.identity import identity_from_facts


def main() -> None:
    records = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    identities = [identity_from_facts({"schema": 1, "packages": {"sglang": f"0.5.{i}"}}) for i in range(8)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.sqlite3"
        with Ledger.open(path) as ledger, ledger.batch() as add:
            for i in range(records):
                details = {"max_abs_error": 1.5e-6, "dtype": "bfloat16", "shape": f"T={i}"}
                add(Entry(EvidenceClass.COMPONENT, f"bundle:sha256:{i:064x}", identities[i % 8], Outcome.PASS, details))
        raw = min(_time(lambda: _raw_select(path)) for _ in range(repeats))
        verified = min(_time(lambda: open_verified_ledger(path)) for _ in range(repeats))
    print(f"{records} records, best of {repeats}")
    print(f"raw SELECT of every row        {raw * 1e3:8.1f} ms")
    print(f"open_verified_ledger (checked) {verified * 1e3:8.1f} ms  ({verified / raw:.1f}x the raw read)")
    print(f"per record                     {verified / records * 1e6:8.1f} us")


def _raw_select(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("SELECT * FROM records ORDER BY id").fetchall()
    conn.execute("SELECT * FROM identities").fetchall()
    conn.close()


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
