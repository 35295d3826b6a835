"""The simulated worker on the wire: the events each release's radix cache would queue, the
``kv_events_config`` a real server reports (and the replay it points at), and the built-in profile.

The expected events are not written down here: ``tests.sim.sglang_recorder`` runs the release's
own recorder (``sglang/srt/mem_cache/events.py``) on the same change. The releases differ in one rule:
from 0.5.18 ``_enqueue_kv_event`` (0.5.18 events.py:38-74; ``KVCacheEventRecorder.enqueue`` from 0.5.19)
merges a BlockStored onto a BlockStored tail whose last hash is its parent, and a BlockRemoved onto a
BlockRemoved tail; 0.5.13.post1 queues one event per page (events.py:60-84 and 98-109).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import yaml
import zmq
from zmq.utils.monitor import recv_monitor_message

from cacheon.gateway.config import parse
from cacheon.kv.contracts import for_version
from cacheon.kv.wire import WireDecoder, operations
from cacheon.sim.cache import PrefixCache, StoredPage
from cacheon.sim.launch import RELEASES, GatewayProcess, free_port, free_range, wait_until
from cacheon.sim.publisher import coalesces
from cacheon.tokens.profile import TokenizerProfile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: simulated workers and a gateway as processes

ROOT = Path(__file__).resolve().parents[2]
END = b"\xff" * 8
PAGE = 4


def start_sim(stack: ExitStack, tmp: Path, version: str, *args: str, replay: bool = True) -> tuple[str, int]:
    """A worker started as an operator would (no --tokenizer); returns its URL and KV port (replay: +1)."""
    port, kv = free_port(), free_range(2)
    log = tmp / f"sim-{port}.log"
    out = stack.enter_context(log.open("wb"))
    cmd = [sys.executable, "-m", "cacheon", "sim", "worker", "--port", str(port), "--kv-port", str(kv),
           "--sglang-version", version, "--releases-dir", str(RELEASES), *args]
    cmd += ["--kv-replay-port", str(kv + 1)] if replay else []
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    stack.callback(proc.wait, 10)
    stack.callback(proc.terminate)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"sim exited: {log.read_text()}")
        return httpx.get(f"{url}/health", timeout=2).status_code == 200

    wait_until(up, f"sim {url} (log {log})")
    return url, kv


def subscribe(stack: ExitStack, ctx: zmq.Context, port: int) -> zmq.Socket:
    """A SUB whose subscription has reached the publisher (a PUB drops what it sends before that)."""
    sub = ctx.socket(zmq.SUB)
    stack.callback(sub.close, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sub.connect(f"tcp://127.0.0.1:{port}")
    assert monitor.poll(10_000), "no ZMQ handshake with the simulator's publisher"
    recv_monitor_message(monitor)
    sub.disable_monitor()
    monitor.close(0)
    time.sleep(0.2)  # the SUBSCRIBE frame follows the handshake at once; let the PUB's I/O thread apply it
    return sub


def receive(sub: zmq.Socket, n: int) -> list[tuple[int, bytes]]:
    out = []
    for _ in range(n):
        assert sub.poll(10_000), f"only {len(out)} of {n} batches arrived"
        _topic, seq, payload = sub.recv_multipart()
        out.append((int.from_bytes(seq, "big"), payload))
    return out


def replay(ctx: zmq.Context, port: int, framing: str) -> list[tuple[int, bytes]]:
    """Every batch the publisher still holds, from seq 0, through its replay ROUTER."""
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        out = []
        while True:
            assert dealer.poll(10_000), "replay went quiet before its end marker"
            frames = dealer.recv_multipart()
            seq, payload = (frames[2], frames[3]) if framing == "topic-seq" else (frames[1], frames[2])
            if seq == END:
                return out
            out.append((int.from_bytes(seq, "big"), payload))
    finally:
        dealer.close(0)


def release_events(version: str, removed: list[int], stored: list[StoredPage]) -> list[Any]:
    """The events ``version``'s own recorder queues for this change (each evicted page a node, as ours are)."""
    change = {
        "page_size": PAGE,
        "removed": [[h] for h in removed],
        "stored": {"parent": stored[0].parent, "hashes": [p.block_hash for p in stored],
                   "tokens": [t for p in stored for t in p.tokens]} if stored else None,
    }
    out = subprocess.run([sys.executable, "-m", "tests.sim.sglang_recorder", str(RELEASES), version],
                         input=json.dumps(change), capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return msgspec.msgpack.decode(bytes.fromhex(out))


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.18", "0.5.23"])
def test_sim_publishes_what_the_release_radix_cache_queues(tmp_path: Path, version: str) -> None:
    first = list(range(1000, 1042))  # 10 full pages and a partial one (not cached)
    second = first[:24] + list(range(2000, 2013))  # 6 cached pages, 3 new; 11 pages fit, so 2 are evicted
    replica = PrefixCache(PAGE, 11 * PAGE)  # what the worker's builtin cache does, step by step
    changes = [replica.insert(first), replica.insert(second)]
    assert [len(r) for _s, r in changes] == [0, 2] and [len(s) for s, _r in changes] == [10, 3]

    contract = for_version(version)
    with ExitStack() as stack:
        url, kv = start_sim(stack, tmp_path, version, "--page-size", str(PAGE), "--capacity-tokens", str(11 * PAGE))
        ctx = zmq.Context()
        stack.callback(ctx.term)
        sub = subscribe(stack, ctx, kv)
        for prompt in (first, second):
            r = httpx.post(f"{url}/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": 1})
            assert r.status_code == 200, r.text
        live = receive(sub, 2)

        # server_info carries the server's --kv-events-config verbatim; its replay_endpoint is the way back.
        info = httpx.get(f"{url}/get_server_info", timeout=5).json()
        config = json.loads(info["kv_events_config"])
        assert config == {"publisher": "zmq", "endpoint": f"tcp://*:{kv}", "topic": "",
                          "replay_endpoint": f"tcp://*:{kv + 1}"}
        # From 0.5.22 the kv_events descriptor names the replay base too (runtime_context.py:2197-2199).
        advertised = info["kv_events"].get("replay_endpoint_port_base")
        assert advertised == (kv + 1 if version in ("0.5.22", "0.5.23") else None)
        replay_at = int(config["replay_endpoint"].rpartition(":")[2])
        assert replay(ctx, replay_at, contract.replay_framing) == live

    assert [seq for seq, _ in live] == [0, 1]
    decoder = WireDecoder(contract)
    for (stored, removed), (_seq, payload) in zip(changes, live, strict=True):
        _ts, events, rank = msgspec.msgpack.decode(payload)
        assert rank == 0
        assert events == release_events(version, removed, stored)
        # The shape, spelled out: per page up to 0.5.13.post1, one event per run of pages from 0.5.18.
        kinds = [(e["type"] if isinstance(e, dict) else e[0], len(e["block_hashes"] if isinstance(e, dict) else e[1]))
                 for e in events]
        if coalesces(version):
            assert kinds == [("BlockRemoved", len(removed))] * bool(removed) + [("BlockStored", len(stored))]
        else:
            assert kinds == [("BlockRemoved", 1)] * len(removed) + [("BlockStored", 1)] * len(stored)
        # And the gateway's decoder reads it back to the same pages.
        ops, skipped = operations(decoder.decode(payload, 0).events)
        assert skipped == 0
        assert ops == [("remove", removed, None)] * bool(removed) + [("store", [p.block_hash for p in stored], stored[0].parent)]


def test_builtin_profile_is_byte_identical_and_a_gateway_configured_from_it_attests_the_worker(
    tmp_path: Path, profile: tuple[Path, Path]
) -> None:
    out = subprocess.run([sys.executable, "-m", "cacheon", "sim", "profile", "--out", str(tmp_path / "p"),
                          "--model", "demo"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    snippet = yaml.safe_load(out)
    entry = snippet["models"]["demo"]
    written = (Path(entry["tokenizer"]), Path(entry["chat_template"]))
    # Another process, another directory: the same bytes as this process's write_profile (conftest).
    assert [p.read_bytes() for p in written] == [p.read_bytes() for p in profile]
    cfg = parse({"policy": "exact", "workers": [], **snippet}, tmp_path)  # the snippet is a valid config part
    TokenizerProfile(cfg.models["demo"])  # and its sha256 pins hold

    with ExitStack() as stack:
        # No --tokenizer. Page size 4: at 1 the gateway's challenge keys pages by their tokens alone, and
        # a token repeated in its prompt then reads as a wrong echo (a gateway issue, reported).
        url, kv = start_sim(stack, tmp_path, "0.5.13.post1", "--model", "demo", "--page-size", str(PAGE),
                            replay=False)
        info = httpx.get(f"{url}/server_info", timeout=5).json()
        assert json.loads(info["kv_events_config"]) == {"publisher": "zmq", "endpoint": f"tcp://*:{kv}", "topic": ""}
        gw = GatewayProcess(stack, tmp_path, written, "exact", [{"url": url}])
        ladder = gw.settled([url])[url]["ladder"]
        assert ladder["state"] == "READY", ladder  # token parity (prompts and chats) and the hash challenge
