"""Thread CPU per gateway function in a benchmark's gateway: ``CPUPROBE=/tmp/cpu PYTHONPATH=benchmarks/cpuprobe``.

Python imports this module at start-up when its directory is on ``PYTHONPATH``; with ``CPUPROBE`` set it wraps
the request path's synchronous parts (tokenizing, the policy and its pieces, the relay's read callback, the
recorder) with ``time.thread_time()`` and writes the sums to ``$CPUPROBE.<pid>.json`` every 0.3 s, so a
gateway stopped by a signal still leaves them. Thread CPU is not inflated by the time slices other processes
take; a wrapped call costs ~1 µs more. Print the table with ``python benchmarks/cpuprobe/summary.py``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from typing import Any

Sums = dict[str, list[float]]  # label -> [thread CPU seconds, calls]


def _wrap(owner: Any, name: str, label: str, sums: Sums) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return inner(*args, **kwargs)
        finally:
            entry = sums.setdefault(label, [0.0, 0])
            entry[0] += time.thread_time() - start
            entry[1] += 1

    setattr(owner, name, timed)


def _install(sums: Sums) -> None:
    from cacheon.gateway import policy, proxy, recorder, upstream
    from cacheon.tokens import chains

    for owner, name, label in (
            (proxy, "encode", "tokenizing (prompt.encode)"), (proxy, "decode", "decode"),
            (proxy, "prompt_of", "prompt_of"), (proxy, "request_id", "request_id"),
            (proxy.Proxy, "_pick", "policy (Proxy._pick)"), (chains.ChainCache, "chain", "  hash chain"),
            (policy.Exact, "_queued", "  _queued"), (policy.InFlight, "shared", "  InFlight.shared"),
            (policy.Exact, "_slot_wait", "  _slot_wait"), (recorder.Recorder, "record", "Recorder.record"),
            (upstream.Response, "data_received", "relay (Response.data_received)")):
        _wrap(owner, name, label, sums)


def _run(out: str) -> None:
    while "cacheon.gateway.service" not in sys.modules:  # only a process that runs a gateway is probed
        time.sleep(0.1)
    sums: Sums = {}
    _install(sums)
    path = f"{out}.{os.getpid()}.json"
    while True:
        time.sleep(0.3)
        with open(path, "w") as fh:
            json.dump({"process_s": time.process_time(), "sums": sums}, fh)


if os.environ.get("CPUPROBE"):
    threading.Thread(target=_run, args=(os.environ["CPUPROBE"],), daemon=True).start()
