"""The compat canary and the weekly check against the REAL installed SGLang at the pin.

Green at the pin, and three negative controls, each a child process that imports the real SGLang,
breaks one thing the way an upstream change would (a symbol removed, a parameter renamed, another
reported version) and runs the real CLI. The children start together so their imports overlap.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cacheon.runtime.pin import SGLANG_PIN
from cacheon.runtime.seams import SEAMS
from tests.runtime.sglang_tier import finish, python_env, sglang_or_skip, start_python

pytestmark = pytest.mark.slow  # the pinned SGLang in child processes

COMPAT = "from cacheon.cli import main; raise SystemExit(main(['compat', '--json']))"
CHECK = "import runpy; runpy.run_path('scripts/check_sglang.py', run_name='__main__')"

MUTATIONS = {
    "pin": "",
    "symbol_removed": "import sglang.srt.layers.activation as m; del m.SiluAndMul\n",
    "param_renamed": (
        "import sglang.srt.layers.layernorm as m\n"
        "def forward_native(self, hidden, residual=None, post_residual_addition=None): pass\n"
        "m.RMSNorm.forward_native = forward_native\n"
    ),
    "version_differs": "import sglang; sglang.__version__ = '0.5.14'\n",
}


class _Index(BaseHTTPRequestHandler):
    """A PyPI-style JSON API that reports a release newer than the pin."""

    def do_GET(self) -> None:
        body = json.dumps({"info": {"version": "0.5.99"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def index_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/pypi/sglang/json"
    server.shutdown()


@pytest.fixture(scope="module")
def runs(index_url: str) -> dict[str, subprocess.CompletedProcess[str]]:
    sglang_or_skip()
    env = python_env(CACHEON_SGLANG_INDEX_URL=index_url)
    procs = {f"compat:{name}": start_python(code + COMPAT, env) for name, code in MUTATIONS.items()}
    procs["check:newer"] = start_python(CHECK, env)
    procs["check:differs"] = start_python(MUTATIONS["version_differs"] + CHECK, env)
    return {name: finish(proc) for name, proc in procs.items()}


def _compat(runs: dict[str, subprocess.CompletedProcess[str]], name: str) -> tuple[int, dict]:
    done = runs[f"compat:{name}"]
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def _rows(document: dict) -> dict[str, dict]:
    return {row["name"]: row for row in document["canary"]["rows"]}


def test_green_at_the_pin(runs):
    code, document = _compat(runs, "pin")
    assert code == 0, document["canary"]
    canary = document["canary"]
    assert canary["version"] == SGLANG_PIN and canary["version_row"]["status"] == "ok"
    rows = _rows(document)
    assert set(rows) == {seam.name for seam in SEAMS}
    assert {name for name, row in rows.items() if row["status"] != "ok"} == {"attention.FlashInferBackend"}
    assert rows["attention.FlashInferBackend"] == {
        "name": "attention.FlashInferBackend",
        "status": "SKIP",
        "detail": "requires flashinfer (not installed)",
    }
    # The record never overstates what was checked: the torchvision stand-in is named.
    environment = document["environment"]
    assert environment["packages"]["sglang"] == SGLANG_PIN
    assert {"name": "torchvision", "version": "0.0.0+cacheon.standin"} in environment["standins"]


def test_removed_symbol_fails_its_row(runs):
    code, document = _compat(runs, "symbol_removed")
    assert code == 2
    row = _rows(document)["activation.SiluAndMul"]
    assert row["status"] == "FAIL" and "is gone" in row["detail"]
    assert [r["name"] for r in document["canary"]["rows"] if r["status"] == "FAIL"] == ["activation.SiluAndMul"]


def test_renamed_parameter_fails_its_row(runs):
    code, document = _compat(runs, "param_renamed")
    assert code == 2
    row = _rows(document)["layernorm.RMSNorm"]
    assert row["status"] == "FAIL"
    assert "lacks parameter(s) x" in row["detail"] and "hidden" in row["detail"]


def test_other_version_differs_even_with_every_seam_present(runs):
    code, document = _compat(runs, "version_differs")
    assert code == 2
    canary = document["canary"]
    assert canary["counts"]["FAIL"] == 0  # every seam is there ...
    assert canary["version_row"] == {  # ... and still the version row fails
        "name": "version",
        "status": "FAIL",
        "detail": f"0.5.14 DIFFERS from pin {SGLANG_PIN}",
    }
    assert "DIFFERS from pin" in canary["verdict"]


def test_check_warns_on_a_newer_release_and_passes_at_the_pin(runs):
    done = runs["check:newer"]
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("::warning title=SGLang release::sglang 0.5.99 is out; the pin is " + SGLANG_PIN)
    assert "::error" not in done.stdout
    assert any(line.startswith("::notice title=SGLang seams::ok:") for line in lines)


def test_check_errors_when_the_installed_version_differs(runs):
    done = runs["check:differs"]
    assert done.returncode == 2
    assert f"::error title=SGLang seam::version: 0.5.14 DIFFERS from pin {SGLANG_PIN}" in done.stdout
