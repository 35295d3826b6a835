"""``cacheon kv`` end to end: the real CLI in a subprocess, real sockets for ``listen``."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from cacheon.kv.hashing import page_hashes
from tests.conftest import REPO

pytestmark = pytest.mark.slow  # the CLI against real sockets

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "kv_wire.json").read_text())


def test_contracts(cli) -> None:
    listing = json.loads(cli("kv", "contracts", "--json").stdout)["contracts"]
    assert [c["id"] for c in listing] == [f"sglang-kv-rank-v{i}" for i in (1, 2, 3, 4)]
    assert {c["promotion"] for c in listing} == {"candidate"}
    text = cli("kv", "contracts").stdout
    assert "0.5.13.post1" in text and "topic-seq" in text


def test_hash(cli, tmp_path: Path) -> None:
    out = cli("kv", "hash", "--page-size", "2", "1", "2", "3", "4", "5")
    assert out.returncode == 0
    assert [int(x) for x in out.stdout.split()] == page_hashes([1, 2, 3, 4, 5], 2)
    (tmp_path / "t.json").write_text("[1, 2, 3]")
    (tmp_path / "t.txt").write_text("1 2\n3\n")
    for name in ("t.json", "t.txt"):
        out = cli("kv", "hash", "--page-size", "1", "--tokens-file", str(tmp_path / name))
        assert [int(x) for x in out.stdout.split()] == page_hashes([1, 2, 3], 1)


@pytest.mark.parametrize(
    "args",
    [
        ["kv", "hash", "--page-size", "1", "-3"],
        ["kv", "hash", "--page-size", "1", "x"],
        ["kv", "hash", "--page-size", "0", "1"],
        ["kv", "hash", "--page-size", "1"],
        ["kv", "hash", "--page-size", "1", "--tokens-file", "/nonexistent"],
        ["kv", "listen", "tcp://127.0.0.1:9", "--sglang-version", "0.5.17"],
        ["kv", "listen", "tcp://127.0.0.1:9", "--contract", "nope"],
        ["kv", "listen", "127.0.0.1:9", "--contract", "sglang-kv-rank-v1"],
        ["kv", "listen", "tcp://127.0.0.1:9", "--replay", "tcp://127.0.0.1:10"],
    ],
)
def test_user_mistakes_are_one_line_errors(cli, args: list[str]) -> None:
    out = cli(*args)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "error" in out.stderr


def run_listen(port: int, *args: str, rank: int = 0) -> subprocess.Popen:
    """``cacheon kv listen`` on the PUB at ``port`` (rank ``rank``'s port), started."""
    return subprocess.Popen(
        [sys.executable, "-m", "cacheon.cli", "kv", "listen", f"tcp://127.0.0.1:{port - rank}", "--rank", str(rank),
         "--timeout", "60", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def pump(pub: zmq.Socket, proc: subprocess.Popen, payloads: list[bytes], extra: list[bytes] | None = None
         ) -> subprocess.CompletedProcess:
    """Send ``payloads`` in turn (and ``extra`` frames after each) until ``proc`` exits."""
    seq, deadline = 0, time.monotonic() + 90  # the CLI's own --timeout is 60 s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            pub.send_multipart([b"", seq.to_bytes(8, "big"), payloads[seq % len(payloads)]])
            if extra:
                pub.send_multipart(extra)
            seq += 1
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def listen_to(payloads: list[bytes], *args: str, rank: int = 0, extra: list[bytes] | None = None
              ) -> subprocess.CompletedProcess:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    try:
        return pump(pub, run_listen(port, *args, rank=rank), payloads, extra)
    finally:
        pub.close(linger=0)
        ctx.term()


def listen(version: str, case: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``cacheon kv listen`` against a PUB that sends ``case`` of ``version`` until it exits."""
    fixture = FIXTURES[version][case]
    return listen_to([base64.b64decode(fixture["payload"])], *args, rank=fixture["rank"]), fixture


def test_listen_prints_decoded_batches() -> None:
    out, fixture = listen("0.5.23", "mixed", "--sglang-version", "0.5.23", "--json", "--count", "2")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 2 and lines[0]["seq"] < lines[1]["seq"]
    assert lines[0]["rank"] == fixture["rank"]
    assert [e["type"] for e in lines[0]["events"]] == [e["type"] for e in fixture["events"]]
    assert lines[0]["events"][3]["block_hashes"] == [3, 4]
    assert '"batches": 2' in out.stderr


def test_listen_rejects_another_releases_wire() -> None:
    out, _ = listen("0.5.20", "stored_page", "--contract", "sglang-kv-rank-v1", "--json")
    assert out.returncode == 2
    (line,) = [json.loads(x) for x in out.stdout.splitlines()]
    assert line["reject"] == "schema_mismatch" and "tagged map" in line["detail"]


def test_listen_classifies_without_a_contract() -> None:
    out, _ = listen("0.5.22", "lora_name", "--json")
    assert out.returncode == 0, out.stderr
    (line,) = [json.loads(x) for x in out.stdout.splitlines()]
    assert line["accepted_by"] == ["sglang-kv-rank-v4"]
    assert set(line["rejected"]) == {"sglang-kv-rank-v1", "sglang-kv-rank-v2", "sglang-kv-rank-v3"}


def test_listen_times_out(cli) -> None:
    out = cli("kv", "listen", "tcp://127.0.0.1:9", "--contract", "sglang-kv-rank-v1", "--timeout", "0.5")
    assert out.returncode == 1 and "timed out with 0 of 1" in out.stderr


def test_listen_survives_hostile_frames() -> None:
    """Frames no publisher sends: deep nesting, a NaN timestamp, an absurd page size, bad framing."""
    hostile = [b"\x91" * 200_000 + b"\xc0", msgspec.msgpack.encode([float("nan"), [], 0]),
               msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [5], 1 << 40, None, "GPU"]], 0])]
    out = listen_to(hostile, "--sglang-version", "0.5.13.post1", "--count", "4", "--json",
                    extra=[b"", b"short-seq", b"x"])  # not [topic, u64 seq, payload] either
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    reasons = {json.loads(line)["reject"] for line in out.stdout.splitlines()}
    assert reasons <= {"decode_error", "out_of_bounds"} and len(out.stdout.splitlines()) == 4, out.stdout
