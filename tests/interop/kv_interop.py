"""Helpers for the KV-event interop matrix: a release's real publisher in a child process,
a lossy forwarding hop, and event specs shared by the tests and the committed fixtures."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

REPO = Path(__file__).resolve().parents[2]
RELEASES_DIR = Path(os.environ.get("SGLANG_RELEASES_DIR", REPO / ".sglang"))
PUBLISHER = Path(__file__).with_name("sglang_publisher.py")
WAIT_S = 60.0  # generous: a loaded 2-core box


def release_dir(version: str) -> Path:
    """The unpacked wheel of ``version``; the matrix is required, so a missing one fails."""
    path = RELEASES_DIR / version
    if not (path / "sglang" / "srt" / "disaggregation" / "kv_events.py").is_file():
        pytest.fail(f"SGLang {version} is not unpacked in {path}: run scripts/install_sglang_releases.sh")
    return path


def stored(hashes: list[int], parent: int | None, page: int = 4, medium: str | None = "GPU", **extra: Any):
    """A BlockStored spec with deterministic tokens (``page`` per block)."""
    tokens = [(h * 7 + i) % 50_000 for h in hashes for i in range(page)]
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": page,
        "lora_id": None,
        "medium": medium,
        **extra,
    }


def removed(hashes: list[int], medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def expected_json(spec: dict[str, Any]) -> dict[str, Any]:
    """What ``event_json`` must print for an event built from ``spec``: nil options omitted."""
    keep = {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id"}
    return {k: v for k, v in spec.items() if k in keep or v is not None}


class ReleasePublisher:
    """One SGLang release's ZmqEventPublisher(s), running its own code in a child process."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.proc = subprocess.Popen(
            [sys.executable, str(PUBLISHER), str(release_dir(version))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.base = self.replay_base = 0

    def call(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], WAIT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            pytest.fail(f"SGLang {self.version} publisher did not answer {cmd['op']} (rc={self.proc.poll()})")
        return json.loads(line)

    def start(self, ranks: int, topic: str = "", buffer_steps: int = 10_000) -> None:
        ports = self.call(op="start", ranks=ranks, topic=topic, buffer_steps=buffer_steps)
        self.base, self.replay_base = ports["base"], ports["replay_base"]

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.base}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_base}"

    def publish(self, rank: int, *events: dict[str, Any]) -> None:
        self.call(op="publish", rank=rank, events=list(events))

    def encode(self, rank: int, *events: dict[str, Any]) -> str:
        return self.call(op="encode", rank=rank, events=list(events))["payload"]

    def restart(self, rank: int) -> None:
        self.call(op="restart", rank=rank)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class LossyHop(threading.Thread):
    """Forwards one publisher's live stream and drops the next N messages on request:
    a real network loss between real sockets, so the subscriber must use replay."""

    def __init__(self, upstream: str) -> None:
        super().__init__(daemon=True)
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(upstream)
        self._pub = self._ctx.socket(zmq.PUB)
        self.port = self._pub.bind_to_random_port("tcp://127.0.0.1")
        self._drop = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.dropped: list[int] = []

    def drop_next(self, n: int) -> None:
        with self._lock:
            self._drop = n

    def run(self) -> None:
        while not self._halt.is_set():
            if not self._sub.poll(50):
                continue
            frames = self._sub.recv_multipart()
            with self._lock:
                if self._drop:
                    self._drop -= 1
                    self.dropped.append(int.from_bytes(frames[1], "big"))
                    continue
            self._pub.send_multipart(frames)

    def close(self) -> None:
        self._halt.set()
        self.join(10)
        self._sub.close(linger=0)
        self._pub.close(linger=0)
        self._ctx.term()


def pump_until(subscriber: Any, done: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``subscriber`` until ``done()``; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; counters {subscriber.counters()}")
        subscriber.poll(0.05)


def join(subscriber: Any, publisher: ReleasePublisher, feeds: list[Any]) -> None:
    """Beat empty batches on each feed's rank until the feed hears one (ZMQ slow joiner)."""
    for feed in feeds:
        deadline = time.monotonic() + WAIT_S
        while feed.expected is None:
            if time.monotonic() > deadline:
                pytest.fail(f"rank {feed.rank} never connected")
            publisher.publish(feed.rank)
            subscriber.poll(0.2)
