"""Child process: one SGLang release's own ZmqEventPublisher, driven by JSON lines on stdin.

Run as ``python sglang_publisher.py RELEASE_DIR`` where RELEASE_DIR holds that release's
wheel unpacked by scripts/install_sglang_releases.sh. Only the release's ``kv_events``
module and what it imports are loaded: the parent packages are stood in by empty package
objects pointing at the real directories, so ``sglang/__init__.py`` (which pulls torch and
torchvision) never runs, while every module that does load is the release's own file.

Commands (one JSON object a line; one JSON reply a line):
  {"op": "start", "ranks": N, "topic": T, "buffer_steps": B}  -> {"base": P, "replay_base": R}
  {"op": "publish", "rank": r, "events": [EVENT...]}          -> {"ok": true} once sent
  {"op": "encode", "rank": r, "events": [EVENT...]}           -> {"payload": BASE64}
  {"op": "restart", "rank": r}                                -> {"ok": true} (seq starts over)
  {"op": "exit"}                                              (no reply; the process ends)
Each ``start`` opens a fresh set of publishers on fresh ports; earlier sets stay up, idle,
until exit. Exit skips the publishers' atexit shutdown, which waits a second apiece.
EVENT: {"type": "BlockStored"|"BlockRemoved"|"AllBlocksCleared", **fields}; a ``cache_salt``
on a release whose BlockStored lacks that field becomes BlockStoredWithMetadata.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import random
import sys
import time
import types
from pathlib import Path
from typing import Any


def load_kv_events(release_dir: Path) -> types.ModuleType:
    root = release_dir.resolve() / "sglang"
    for name in ("sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.disaggregation"):
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = package
    module = importlib.import_module("sglang.srt.disaggregation.kv_events")
    if "torch" in sys.modules:
        raise SystemExit("kv_events pulled in torch; the interop harness must not need it")
    return module


def build_event(kv: types.ModuleType, spec: dict[str, Any]) -> Any:
    fields = dict(spec)
    kind = fields.pop("type")
    if kind == "BlockStored" and "cache_salt" in fields and "cache_salt" not in kv.BlockStored.__struct_fields__:
        salt = fields.pop("cache_salt")
        return kv.BlockStoredWithMetadata(**fields, metadata=kv.BlockStoredMetadata(cache_salt=salt))
    return getattr(kv, kind)(**fields)


class Publishers:
    def __init__(self, kv: types.ModuleType) -> None:
        self.kv = kv
        self.pubs: dict[int, Any] = {}
        self.retired: list[Any] = []
        self.config: dict[str, Any] = {}

    def start(self, ranks: int, topic: str, buffer_steps: int) -> dict[str, int]:
        self.retired.extend(self.pubs.values())  # keep them referenced: idle, not shut down
        self.pubs = {}
        for _ in range(50):  # random ports below Linux's ephemeral range; retry where taken
            base = random.randrange(20000, 32000)
            replay_base = base + ranks
            self.config = {
                "endpoint": f"tcp://*:{base}",
                "replay_endpoint": f"tcp://127.0.0.1:{replay_base}",
                "topic": topic,
                "buffer_steps": buffer_steps,
            }
            try:
                for rank in range(ranks):
                    self.pubs[rank] = self.kv.ZmqEventPublisher(attn_dp_rank=rank, **self.config)
            except Exception:  # a port in use: try other ports
                self.retired.extend(self.pubs.values())
                self.pubs = {}
                continue
            return {"base": base, "replay_base": replay_base}
        raise SystemExit("no free port range found")

    def restart(self, rank: int) -> None:
        self.pubs.pop(rank).shutdown()
        deadline = time.monotonic() + 20
        while True:
            try:
                self.pubs[rank] = self.kv.ZmqEventPublisher(attn_dp_rank=rank, **self.config)
                return
            except Exception:  # the old socket's port is released asynchronously
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def publish(self, rank: int, events: list[Any]) -> None:
        pub = self.pubs[rank]
        pub.publish(self.kv.KVEventBatch(ts=time.time(), events=events))
        pub._event_queue.join()  # returns once the publisher thread has sent the batch


def main() -> None:
    kv = load_kv_events(Path(sys.argv[1]))
    pubs = Publishers(kv)
    encoder = __import__("msgspec").msgpack.Encoder()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "start":
            reply: dict[str, Any] = pubs.start(cmd["ranks"], cmd.get("topic", ""), cmd.get("buffer_steps", 10_000))
        elif op == "publish":
            pubs.publish(cmd["rank"], [build_event(kv, e) for e in cmd["events"]])
            reply = {"ok": True}
        elif op == "encode":
            events = [build_event(kv, e) for e in cmd["events"]]
            batch = kv.KVEventBatch(ts=1.0, events=events, attn_dp_rank=cmd["rank"])
            reply = {"payload": base64.b64encode(encoder.encode(batch)).decode()}
        elif op == "restart":
            pubs.restart(cmd["rank"])
            reply = {"ok": True}
        elif op == "exit":
            break
        else:
            raise SystemExit(f"unknown op {op!r}")
        print(json.dumps(reply), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
