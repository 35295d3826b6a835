"""The Cacheon side of the KV benchmarks' workloads (``_chains``): a filled index, and the peer runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _chains import prompt_chains

from cacheon.gateway.index import BlockIndex

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / ".peers"


def fill(index: BlockIndex, workers: int, blocks: int, seed: int, keep: int = 0) -> list[list[int]]:
    """Store ``blocks`` ids over ``workers`` as ``_chains.prompt_chains``; returns the first ``keep`` chains."""
    kept: list[list[int]] = []
    for worker, chain in prompt_chains(workers, blocks, seed):
        index.apply(("w", worker), [("store", chain)])
        if len(kept) < keep:
            kept.append(chain)
    return kept


def answers(found: dict) -> list[tuple[int, int]]:
    """A ``longest_prefix`` answer as (worker, depth) pairs, the shape the peer reports."""
    return sorted((source[1], depth) for source, depth in found.items())


def peer_python(name: str) -> Path:
    python = PEERS / name / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"peer {name} is not installed: run benchmarks/peers/install.sh {name}")
    return python


def dynamo(mode: str, **options: object) -> dict:
    """Run ``peers/dynamo_tree.py MODE`` in Dynamo's venv and return what it printed."""
    argv = [str(peer_python("ai-dynamo-runtime")), str(ROOT / "benchmarks" / "peers" / "dynamo_tree.py"), mode]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the Dynamo side failed (exit {done.returncode}): {' '.join(argv[1:])}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def failed(message: str) -> None:
    """A checked-and-failed benchmark (a cross-check or a workload digest): exit 2, as the CLI does."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def crosscheck(what: str, ours: list[list[tuple[int, int]]], theirs: list[list[list[int]]]) -> int:
    """Answers that differ between the indexes; prints the first few. Any difference is a failed benchmark."""
    wrong = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != [tuple(x) for x in b]]
    for i in wrong[:3]:
        print(f"  {what} answer {i} differs: cacheon {ours[i]} dynamo {theirs[i]}", file=sys.stderr)
    return len(wrong)
