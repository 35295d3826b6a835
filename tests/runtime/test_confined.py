"""``cacheon serve`` / ``cacheon.serving.confined`` without a server: what is refused before a boot,
and the relay a confined server's ports cross (TCP on 127.0.0.1 ⇄ a Unix socket ⇄ TCP)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cacheon.serving import relay
from cacheon.serving.confined import ConfinedServer, Ports, ServeError, ServeRequest
from cacheon.verify.plan import Confinement
from tests.runtime.sglang_tier import EXAMPLES

REPO = Path(__file__).resolve().parents[2]


def _request(tmp_path: Path, **extra) -> ServeRequest:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    return ServeRequest(Path(sys.executable), model, extra.pop("bundle", None), Ports(1, 2, 3), **extra)


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("flag", ["--port", "--host=0.0.0.0", "--kv-events-config", "--model-path"])
def test_the_flags_serve_manages_itself_are_refused(tmp_path, flag) -> None:
    with pytest.raises(ServeError, match="set by cacheon serve itself"):
        ConfinedServer(_request(tmp_path, server_args=(flag, "x")))


@pytest.mark.parametrize("key", ["CACHEON_BUNDLE", "CACHEON_TEST_ONLY_ADMIT_UNSCANNED_DIGEST", "PYTHONPATH"])
def test_the_environment_serve_arms_with_cannot_be_set_from_outside(tmp_path, key) -> None:
    """``--env CACHEON_BUNDLE=/cacheon/model`` would arm files no scan admitted (with the test-only
    digest beside it, even refused ones); ``PYTHONPATH`` another cacheon."""
    with pytest.raises(ServeError, match=f"{key} is set by cacheon serve itself"):
        ConfinedServer(_request(tmp_path, env={key: "x"}))


def test_a_bundle_scan_refuses_is_not_served(tmp_path) -> None:
    server = ConfinedServer(_request(tmp_path, bundle=EXAMPLES / "silu-scan-violation"), tmp_path)
    with pytest.raises(ServeError, match="scan did not admit the bundle"):
        server.start()
    assert server.process is None
    server.close()


def test_the_unconfined_description_says_so(tmp_path) -> None:
    server = ConfinedServer(_request(tmp_path, confinement=Confinement.NONE), tmp_path)
    assert server.describe()["confinement"] == "none" and "UNCONFINED" in server.describe()["warning"]
    server.close()


@pytest.mark.slow  # the CLI as a process
def test_the_cli_refuses_a_bundle_scan_refuses_in_one_line(tmp_path) -> None:
    (tmp_path / "model").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "cacheon", "serve", "--engine", sys.executable, "--model", str(tmp_path / "model"),
         "--bundle", str(EXAMPLES / "silu-scan-violation"), "--confinement", "none"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "UNCONFINED" in done.stderr and "scan did not admit the bundle" in done.stderr
    assert "Traceback" not in done.stderr


def test_bytes_cross_the_relay_both_ways(tmp_path) -> None:
    """The two halves as serve runs them: host TCP → Unix socket → the server's TCP port."""
    server = socket.create_server(("127.0.0.1", 0))
    inner = server.getsockname()[1]
    outer = _free()

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data.upper())

    threading.Thread(target=echo, daemon=True).start()
    long = tmp_path / ("d" * 120)  # past a Unix socket path's 108 bytes: the descriptor's name stays short
    long.mkdir()
    sockets = relay.SocketDirectory(long)
    sock = sockets.path(inner)
    listening = relay.listen_unix(sock)  # made by the host; the sandbox side gets the descriptor
    inside = relay.RelayThread(lambda: [relay.unix_to_tcp(listening, inner)])
    host = relay.RelayThread(lambda: [relay.tcp_to_unix(outer, sock)])
    try:
        with socket.create_connection(("127.0.0.1", outer), timeout=5) as conn:
            conn.sendall(b"kv frames")  # no half-close: a client that shuts its write side first can lose the
            assert conn.recv(1024) == b"KV FRAMES"  # reply (seen 1 in ~30 runs here; not yet understood)
    finally:
        host.close()
        inside.close()
        server.close()
        sockets.close()
