"""verify/scan/package/slots through the real CLI: JSON, archives, isolation failures, user errors."""

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, write_bundle

pytestmark = pytest.mark.slow  # the CLI and candidate children


def bundle(tmp_path: Path, body: str) -> Path:
    return write_bundle(tmp_path, "activation.silu_and_mul", "silu_and_mul", textwrap.dedent(body))


def test_json_report_carries_verdict_cases_digest_and_environment(cli):
    result = cli("verify", str(EXAMPLES / "attention-torch"), "--json", "--dtype", "float32", "--seed", "5")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"] == "PASS" and report["seed"] == 5
    assert report["bundle_digest"].startswith("sha256:")
    assert report["environment"]["torch"].startswith("2.") and report["environment"]["device"] == "cpu"
    cases = report["ops"][0]["cases"]
    # 5 registered shapes and their jitter, two trials each; a drawn shape (two), the largest serving count,
    # and four more of the pin's serving token counts (the smallest and three drawn)
    assert len(cases) == 27 and all(c["dtype"] == "float32" and c["ok"] for c in cases)
    assert [c["note"].split()[0] for c in cases[20:]] == ["drawn", "drawn", "serving", *["count"] * 4]
    # float32-faithful (a scaled serving count's outputs reach ~3, so its absolute error passes atol alone)
    assert all(c["max_abs_err"] < 1e-3 for c in cases)


def test_verify_reads_a_packaged_archive(cli, tmp_path):
    archive = tmp_path / "silu.tar.gz"
    packaged = cli("package", str(EXAMPLES / "silu-torch"), "--out", str(archive))
    assert packaged.returncode == 0, packaged.stderr
    digest = packaged.stdout.split()[0]
    result = cli("verify", str(archive), "--dtype", "bfloat16")
    assert result.returncode == 0, result.stderr
    assert f"NUMERICAL_PASS  silu-torch {digest}" in result.stdout


def test_hung_kernel_is_killed_and_reported(cli, tmp_path):
    root = bundle(tmp_path, """
        def silu_and_mul(x, out):
            while True:
                pass
    """)
    result = cli("verify", str(root), "--timeout", "3")
    assert result.returncode == 2
    assert "candidate timeout" in result.stdout and "was killed" in result.stdout


def test_system_exit_is_a_candidate_failure_in_one_line(cli, tmp_path):
    root = bundle(tmp_path, """
        def silu_and_mul(x, out):
            raise SystemExit(3)
    """)
    result = cli("verify", str(root))
    assert result.returncode == 2
    assert "entry raised: SystemExit: 3" in result.stdout and "Traceback" not in result.stdout


def test_raising_kernel_and_import_error(cli, tmp_path):
    root = bundle(tmp_path / "a", """
        def silu_and_mul(x, out):
            raise ValueError("nope")
    """)
    result = cli("verify", str(root))
    assert result.returncode == 2 and "entry raised: ValueError: nope" in result.stdout
    # an entry the source does not define is a manifest error (exit 1, one line), not a verdict
    missing = bundle(tmp_path / "b", "def other(x, out):\n    pass\n\n\nsilu_and_mul = other\n")
    for command in ("verify", "scan"):
        result = cli(command, str(missing))
        assert result.returncode == 1, result.stdout + result.stderr
        assert "'silu_and_mul', which is not a top-level function of kernels/k.py" in result.stderr
        assert "Traceback" not in result.stderr
    assert "[missing-entry]" in result.stdout  # scan lists it among its findings


def test_partial_rows_fail(cli, tmp_path):
    root = bundle(tmp_path, """
        import torch

        def silu_and_mul(x, out):
            d = x.shape[-1] // 2
            half = x.shape[0] // 2 + 1
            out[:half] = torch.nn.functional.silu(x[:half, :d]) * x[:half, d:]
    """)
    result = cli("verify", str(root), "--keep-going", "--json", "--stability-calls", "0")
    assert result.returncode == 2
    report = json.loads(result.stdout)
    assert any(c["ok"] for c in report["ops"][0]["cases"])  # T=1 is fully written
    failures = [f for c in report["ops"][0]["cases"] for f in c["failures"]]
    # what the kernel left unwritten is the poison of that call: NaN, ±inf or plausible finite values
    assert failures and all("non-finite" in f or "outside tolerance" in f for f in failures)


def test_user_errors_are_one_line_exit_1(cli, tmp_path):
    for args, text in [
        (("verify", str(tmp_path / "missing")), "does not exist"),
        (("scan", str(tmp_path)), "missing manifest.toml"),
        (("verify", str(EXAMPLES / "silu-torch"), "--device", "cuda"), "no CUDA device"),
        (("verify", str(EXAMPLES / "silu-torch"), "--device", "tpu"), "invalid choice"),
    ]:
        result = cli(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert text in result.stderr and "Traceback" not in result.stderr


def test_dtype_outside_the_manifest_is_reported(cli, tmp_path):
    root = bundle(tmp_path, "def silu_and_mul(x, out):\n    pass\n")
    result = cli("verify", str(root), "--dtype", "bfloat16")
    assert result.returncode == 2 and "no dtype left to verify" in result.stdout


def test_slots_json_and_text(cli):
    data = json.loads(cli("slots", "--json").stdout)
    assert data["digest"].startswith("sha256:") and data["abi_version"] == "cacheon-op-abi-v1"
    names = [s["name"] for s in data["slots"]]
    assert {"activation.silu_and_mul", "norm.rmsnorm", "attention.sdpa"} <= set(names)
    text = cli("slots").stdout
    assert "rmsnorm(x, weight, out, eps)" in text and "attention(q, k, v, out, sm_scale, causal)" in text


def test_a_shipped_pyc_is_refused(cli, tmp_path):
    """The scan refuses the cache (tests/unit/test_loader.py: the loader would not read it either)."""
    import importlib.util
    import py_compile

    root = bundle(tmp_path / "b", """
        import torch

        def silu_and_mul(x, out):
            d = x.shape[-1] // 2
            out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    """)
    evil = tmp_path / "evil.py"
    evil.write_text("def silu_and_mul(x, out):\n    out.zero_()\n")
    cached = Path(importlib.util.cache_from_source(str(root / "kernels" / "k.py")))
    py_compile.compile(str(evil), cfile=str(cached), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    result = cli("verify", str(root))
    assert result.returncode == 2 and "kernels/__pycache__:0: [bytecode]" in result.stderr
    assert "the bundle was not executed" in result.stderr


def test_a_bundle_module_shadowing_an_installed_one_is_refused(cli, tmp_path):
    root = bundle(tmp_path, "def silu_and_mul(x, out):\n    pass\n")
    (root / "numpy.py").write_text("X = 1\n")
    manifest = (root / "manifest.toml").read_text().replace('abi_version', 'include = ["numpy.py"]\nabi_version')
    (root / "manifest.toml").write_text(manifest)
    result = cli("verify", str(root))
    assert result.returncode == 2
    assert "shadows the installed module 'numpy'" in result.stdout
