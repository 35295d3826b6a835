"""A real separate process that appends to a ledger (used by the concurrency and SIGKILL tests).

usage: _writer.py append LEDGER WRITER COUNT START_FILE   one transaction per record, after START_FILE exists
       _writer.py batch-then-hang LEDGER COUNT             commits one record, then hangs mid-batch
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cacheon.evidence.classes import EvidenceClass, Outcome
from cacheon.evidence.ledger import Entry, Ledger
from cacheon.runtime.identity import identity_from_facts

IDENTITY = identity_from_facts({"schema": 1, "packages": {"sglang": "writer-test"}})


def entry(subject: str) -> Entry:
    return Entry(EvidenceClass.COMPONENT, subject, IDENTITY, Outcome.PASS, {"writer": subject})


def main() -> None:
    mode, path = sys.argv[1], Path(sys.argv[2])
    if mode == "append":
        writer, count, start = sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
        while not start.exists():
            time.sleep(0.01)
        with Ledger.open(path) as ledger:
            for i in range(count):
                ledger.append(entry(f"bundle:{writer}-{i}"))
    elif mode == "batch-then-hang":
        count = int(sys.argv[3])
        with Ledger.open(path) as ledger:
            ledger.append(entry("bundle:committed-before"))
            with ledger.batch() as add:
                for i in range(count):
                    add(entry(f"bundle:batch-{i}"))
                    if i == count // 2:
                        print("MID-BATCH", flush=True)
                        time.sleep(120)  # killed here
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
