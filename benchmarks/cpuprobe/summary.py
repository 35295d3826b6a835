"""The table of ``sitecustomize.py``'s sums: thread CPU ms per request for each wrapped part, per gateway process.

    python benchmarks/cpuprobe/summary.py /tmp/cpu      # reads /tmp/cpu.<pid>.json
"""

from __future__ import annotations

import glob
import json
import sys


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    files = sorted(glob.glob(f"{sys.argv[1]}.*.json"))
    if not files:
        sys.exit(f"no {sys.argv[1]}.<pid>.json: was CPUPROBE set and the probe's directory on PYTHONPATH?")
    for path in files:
        with open(path) as fh:
            found = json.load(fh)
        sums = found["sums"]
        requests = int(sums.get("policy (Proxy._pick)", [0, 0])[1])
        if not requests:
            continue
        print(f"{path}: {requests} requests routed, process CPU {found['process_s']:.2f} s in all")
        for label, (seconds, calls) in sorted(sums.items(), key=lambda kv: -kv[1][0]):
            print(f"  {label:<34} {seconds * 1e3 / requests:7.3f} ms/request  {calls / requests:5.1f} calls/request")


if __name__ == "__main__":
    main()
