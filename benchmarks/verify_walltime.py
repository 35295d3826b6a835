"""What one op bundle's ``cacheon verify`` costs on CPU, this tree against a baseline commit.

The baseline's ``src`` and ``examples`` are exported (``git archive``) into a temporary directory
and both trees verify the same bundle with the same seed, alternately, in the same run, so a
shared and loaded host slows both alike; the ratio of the medians is the figure (issue 20: at most
1.5x). Wall time of the whole CLI: start-up, sandbox, every stage.

usage: python benchmarks/verify_walltime.py [--baseline 7dab821] [--repeats 3] [--triton]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUNDLES = {"silu-torch": {}, "silu-triton": {"TRITON_INTERPRET": "1"}}


def _export(commit: str, into: Path) -> None:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src", "examples"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def _verify(tree: Path, bundle: str, seed: int, extra: dict[str, str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), **extra}
    argv = [sys.executable, "-m", "cacheon", "verify", str(tree / "examples" / "bundles" / bundle), "--seed", str(seed)]
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{tree}: verify {bundle} exited {result.returncode}:\n{result.stdout[-2000:]}{result.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="7dab821")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--triton", action="store_true", help="also silu-triton under TRITON_INTERPRET=1")
    args = parser.parse_args()
    bundles = ["silu-torch", "silu-triton"] if args.triton else ["silu-torch"]
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp)
        _export(args.baseline, baseline)
        for bundle in bundles:
            times: dict[str, list[float]] = {"baseline": [], "this tree": []}
            for rep in range(args.repeats):
                times["baseline"].append(_verify(baseline, bundle, rep, BUNDLES[bundle]))
                times["this tree"].append(_verify(REPO, bundle, rep, BUNDLES[bundle]))
            print(f"verify {bundle} (all dtypes, default stability calls), {args.repeats} runs each, alternating")
            for name, values in times.items():
                median = statistics.median(values)
                print(f"  {name:<10} median {median:6.1f} s  range {min(values):6.1f}-{max(values):6.1f} s")
            ratios = [t / b for t, b in zip(times["this tree"], times["baseline"], strict=True)]
            ratio = statistics.median(times["this tree"]) / statistics.median(times["baseline"])
            print(f"  ratio of medians {ratio:.2f}x  (per pair {min(ratios):.2f}-{max(ratios):.2f}x)")


if __name__ == "__main__":
    main()
