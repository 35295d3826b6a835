"""The weekly release check against a real local HTTP index, and the script end to end without SGLang."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cacheon.runtime.canary import CanaryReport
from cacheon.runtime.release_check import (
    Finding,
    annotation,
    canary_findings,
    exit_code,
    latest_release,
    release_finding,
)
from cacheon.runtime.surface import Row
from tests.runtime.sglang_tier import REPO, python_env

PIN = "0.5.13.post1"
RESPONSES: dict[str, tuple[int, bytes]] = {
    "/newer": (200, json.dumps({"info": {"version": "0.5.23"}}).encode()),
    "/same": (200, json.dumps({"info": {"version": PIN}}).encode()),
    "/garbage": (200, b"<html>not json</html>"),
    "/noversion": (200, json.dumps({"info": {}}).encode()),
    "/weird": (200, json.dumps({"info": {"version": "not a version!"}}).encode()),
    "/missing": (404, b"{}"),
}


class _Index(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, body = RESPONSES[self.path]
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def index() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/pypi/sglang/json"


def test_newer_release_is_a_warning_naming_both_versions(index):
    finding = release_finding(PIN, lambda: latest_release(index + "/newer"))
    assert finding.level == "warning"
    assert finding.message.startswith(f"sglang 0.5.23 is out; the pin is {PIN}. A bump is a reviewed rebaseline")


def test_pin_is_latest_is_a_notice(index):
    assert release_finding(PIN, lambda: latest_release(index + "/same")).level == "notice"


@pytest.mark.parametrize("path", ["/garbage", "/noversion", "/missing", "/weird"])
def test_unreadable_answers_are_warnings_not_crashes(index, path):
    finding = release_finding(PIN, lambda: latest_release(index + path))
    assert finding.level == "warning" and finding.title == "SGLang release check"


def test_unreachable_index_is_a_warning(closed_port_url):
    finding = release_finding(PIN, lambda: latest_release(closed_port_url, timeout_s=5))
    assert finding.level == "warning" and "index unreachable" in finding.message


def _report(version: str | None, rows: tuple[Row, ...], error: str | None = None) -> CanaryReport:
    return CanaryReport("sglang", PIN, version, error, rows)


def test_differs_and_fail_rows_are_errors_and_fail_the_run():
    report = _report("0.5.14", (Row("a", "ok", "fine"), Row("b", "FAIL", "b is gone")))
    findings = canary_findings(report)
    assert [(f.level, f.message) for f in findings] == [
        ("error", f"version: 0.5.14 DIFFERS from pin {PIN}"),
        ("error", "b: b is gone"),
    ]
    assert exit_code(findings) == 2


def test_not_importable_is_coverage_skipped_never_claimed():
    report = _report(None, (Row("a", "SKIP", "not checked"),), error="ModuleNotFoundError: No module named 'sglang'")
    (finding,) = canary_findings(report)
    assert finding.level == "warning" and "seam coverage SKIPPED, nothing claimed" in finding.message
    assert exit_code([finding]) == 0


def test_annotation_escapes_as_github_requires():
    line = annotation(Finding("warning", "a: b, c", "50% done\nnext line"))
    assert line == "::warning title=a%3A b%2C c::50%25 done%0Anext line"


def _script(tmp_path, index_url: str) -> subprocess.CompletedProcess[str]:
    """Run scripts/check_sglang.py with an importable-but-broken ``sglang`` shadowing any real one."""
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("raise ImportError('cacheon test: sglang unavailable')\n")
    return subprocess.run(
        [sys.executable, "scripts/check_sglang.py"],
        cwd=REPO,
        env=python_env(tmp_path, CACHEON_SGLANG_INDEX_URL=index_url),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_script_without_sglang_still_checks_releases_and_skips_seams(tmp_path, index):
    done = _script(tmp_path, index + "/newer")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("::warning title=SGLang release::sglang 0.5.23 is out")
    assert lines[1].startswith("::warning title=SGLang seams::sglang is not importable (ImportError: cacheon test")
    assert "seam coverage SKIPPED" in lines[1]
    assert lines[-1] == "FAIL: sglang cannot be imported; no surface was checked"
    assert "::error" not in done.stdout and "Traceback" not in done.stderr


def test_script_with_an_unreachable_index_warns_and_does_not_crash(tmp_path, closed_port_url):
    done = _script(tmp_path, closed_port_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("::warning title=SGLang release check::index unreachable")
    assert "Traceback" not in done.stderr
