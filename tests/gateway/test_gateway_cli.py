"""User mistakes on the gateway, sim and demo commands: one line, exit 1."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cacheon.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim", "worker", "--port", "1", "--kv-port", "2", "--sglang-version", "0.5.17", "--tokenizer", "t.json"],
         "no KV-event contract covers SGLang '0.5.17'"),
        (["sim", "worker", "--port", "1", "--kv-port", "2", "--sglang-version", "0.5.22", "--tokenizer", "t.json",
          "--fault", "gremlins"], "unknown fault 'gremlins'"),
        (["sim", "profile", "--out", "/proc/no-such-dir"], "cannot write the profile to /proc/no-such-dir"),
        (["sim", "worker", "--port", "1", "--kv-port", "2", "--sglang-version", "0.5.22", "--tokenizer",
          "missing.json"], "cannot read missing.json"),
    ],
)
def test_usage_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_check_config(tmp_path: Path, profile: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "gw.yaml"
    good.write_text(f"policy: exact\nworkers: [{{url: 'http://127.0.0.1:1'}}]\nmodels: {{demo: {{tokenizer: {profile[0]}}}}}\n")
    assert main(["gateway", "check-config", str(good)]) == 0
    assert "ok: policy exact, 1 worker(s), 1 model(s)" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text('policy = "exact"\n[models.demo]\ntokenizer = "missing.json"\n')
    assert main(["gateway", "check-config", str(bad)]) == 1
    assert "cannot read" in capsys.readouterr().err


@pytest.fixture
def restore_logging():
    """``gateway serve`` configures the cacheon loggers; put them back for the tests after."""
    import logging

    logger = logging.getLogger("cacheon")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def _busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


@pytest.mark.parametrize("which", ["listen", "admin.listen"])
def test_serve_fails_in_one_line_before_any_banner_when_a_port_is_taken(
        which: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    busy, port = _busy_port()
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    other = free.getsockname()[1]
    free.close()
    ports = {"listen": port, "admin": other} if which == "listen" else {"listen": other, "admin": port}
    config = tmp_path / "gw.yaml"
    config.write_text(f"policy: rr\nlisten: 127.0.0.1:{ports['listen']}\nadmin: {{listen: '127.0.0.1:{ports['admin']}'}}\n")
    try:
        assert main(["gateway", "serve", "--config", str(config)]) == 1
    finally:
        busy.close()
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        f"cacheon gateway: error: {which} 127.0.0.1:{port}: address already in use"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("policy: exact\nmodels: {demo: {tokenizer: missing.json}}\n", "models.demo: cannot read"),
        ("policy: rr\nadmin: {listen: '0.0.0.0:0'}\n", "admin.listen 0.0.0.0:0 is not a loopback address"),
        ("policy: rr\nworkers: [{url: 'http://x:1', kv_port: 70000}]\n", "workers[0].kv_port: expected int <= 65535"),
        ("policy: rr\ntracing: {enabled: true, exporter: zipkin}\n", "tracing.exporter: invalid enum value 'zipkin'"),
    ],
)
def test_serve_refuses_unusable_config_in_one_line(config: str, message: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str], restore_logging: None) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(config)
    assert main(["gateway", "serve", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and message in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture
def restore_sglang_modules():
    """The simulator loads a release's kv_events under stand-in ``sglang`` packages: drop them after."""
    import sys

    before = {k for k in sys.modules if k == "sglang" or k.startswith("sglang.")}
    yield
    for name in [k for k in sys.modules if (k == "sglang" or k.startswith("sglang.")) and k not in before]:
        del sys.modules[name]


@pytest.mark.parametrize("flag", ["--port", "--kv-port"])
def test_a_simulated_worker_on_a_taken_port_is_one_line(flag: str, capsys: pytest.CaptureFixture[str],
                                                       restore_sglang_modules: None) -> None:
    busy, port = _busy_port()
    free, other = _busy_port()
    free.close()
    ports = {"--port": port, "--kv-port": other} if flag == "--port" else {"--port": other, "--kv-port": port}
    try:
        code = main(["sim", "worker", "--port", str(ports["--port"]), "--kv-port", str(ports["--kv-port"]),
                     "--sglang-version", "0.5.13.post1"])
    finally:
        busy.close()
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and f"{flag} {port}" in err and "in use" in err and len(err.splitlines()) == 1
