"""Coverage-guided fuzzing of the KV ingest path with atheris (libFuzzer), seeded with real frames.

Each input goes through a ``Feed`` (sequencer, decoder, index) under every contract, as one live
message after a good one. A crash is any exception escaping the feed, or a refused batch that
changed the index. libFuzzer's ``-rss_limit_mb`` bounds memory; ``-max_total_time`` the run.

    python tests/kv/fuzz_wire.py CORPUS_DIR -max_total_time=20 -rss_limit_mb=2048
    python tests/kv/fuzz_wire.py --seed-corpus CORPUS_DIR   (write the fixtures' frames there first)
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from cacheon.kv.contracts import CONTRACTS
    from cacheon.kv.feed import Feed
    from cacheon.kv.index import BlockIndex

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "kv_wire.json").read_text())
FRAMES = [base64.b64decode(c["payload"]) for v in FIXTURES.values() for c in v.values()]
SOURCE = ("w", 0)


def one_input(data: bytes) -> None:
    for contract in CONTRACTS:
        index: BlockIndex[tuple[str, int]] = BlockIndex()
        feed = Feed(SOURCE, contract, index=index)
        feed.on_live(0, FRAMES[len(data) % len(FRAMES)])  # some state for a bad batch to damage
        before, refused = index.held(SOURCE), sum(feed.counters.rejects.values())
        feed.on_live(1, data)
        if sum(feed.counters.rejects.values()) > refused and index.held(SOURCE) != before:
            raise AssertionError(f"{contract.id}: a refused batch changed the index")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--seed-corpus":
        out = Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        for i, frame in enumerate(FRAMES):
            (out / f"fixture-{i}").write_bytes(frame)
        return
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
