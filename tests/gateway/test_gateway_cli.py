"""User mistakes on the gateway, sim and demo commands: one line, exit 1."""

from __future__ import annotations

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
        (["demo", "--workers", "0"], "workers, sessions, turns and page size must be >= 1"),
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
