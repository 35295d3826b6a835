"""Every embedded example through the real CLI: the documented verdict, exit code and reason."""

import json

import pytest

from tests.conftest import EXAMPLES, assert_verdict

pytestmark = pytest.mark.slow  # every example through the CLI

# bundle -> (exit code, verdict, text that must appear in the output)
EXPECTED = {
    "silu-torch": (0, "NUMERICAL_PASS", "CUDA-graph replay proof not run"),
    "silu-triton": (0, "NUMERICAL_PASS", "CUDA-graph replay proof not run"),
    "rmsnorm-torch": (0, "NUMERICAL_PASS", "CUDA-graph replay proof not run"),
    "rmsnorm-triton": (0, "NUMERICAL_PASS", "CUDA-graph replay proof not run"),
    "attention-torch": (0, "PASS", "cases matched the float64 reference"),
    "silu-broken-no-silu": (2, "FAIL", "elements outside tolerance"),
    "rmsnorm-broken-no-norm": (2, "FAIL", "elements outside tolerance"),
    "attention-broken-causal": (2, "FAIL", "causal=True #0: output out"),
    "silu-cheat-writes-input": (2, "FAIL", "input x was modified by the candidate"),
    "silu-cheat-replaces-out": (2, "FAIL", "storage was replaced"),
    "silu-cheat-caches-output": (2, "FAIL", "#1"),
    "silu-cheat-skips-rows": (2, "FAIL", "output out"),
    # Only a CUDA graph can expose it; on CPU the verdict must not claim more than numerics.
    "silu-cheat-graph-noop": (0, "NUMERICAL_PASS", "CUDA-graph replay proof not run"),
    # block selections (judged by the top-8 blocks per row, masks exact) and the MoE collectives
    "msa-block-torch": (0, "NUMERICAL_PASS", "CUDA-graph replay proof not run"),
    "msa-block-broken-ignores-lens": (2, "FAIL", "finite where the reference is -inf (masked)"),
    "msa-prefill-torch": (0, "PASS", "cases matched the float64 reference"),
    "msa-prefill-broken-block-mean": (2, "FAIL", "picks in the reference's top-8"),
    "moe-reduce-torch": (0, "PASS", "cases matched the float64 reference"),
    "moe-reduce-broken-local": (2, "FAIL", "rank 0: output out: matched ratio"),
    "moe-finalize-torch": (0, "PASS", "cases matched the float64 reference"),
    "moe-finalize-broken-trim-stride": (2, "FAIL", "Tpad="),
}
#: collectives are verified at world size 2 above and at 3 here
WORLD_THREE = {
    "moe-reduce-torch": (0, "PASS", "cases matched the float64 reference"),
    "moe-reduce-broken-local": (2, "FAIL", "matched ratio"),
    "moe-finalize-torch": (0, "PASS", "cases matched the float64 reference"),
    "moe-finalize-broken-trim-stride": (2, "FAIL", "elements outside tolerance"),
}


def test_every_example_has_an_expectation():
    from tests.cli.test_adversarial import DEPTH

    on_disk = {p.name for p in EXAMPLES.iterdir() if (p / "manifest.toml").exists()}
    assert on_disk == set(EXPECTED) | set(DEPTH) | {"silu-scan-violation", "silu-gptoss-torch"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_verdict(cli, name):
    code, verdict, text = EXPECTED[name]
    # The Triton interpreter is slow on CPU: one dtype proves the path (`make run` shows two), and a
    # call at the pin's largest serving count (8192 tokens, every run) takes a minute or more there.
    dtypes = ["--dtype", "bfloat16", "--timeout", "600"] if "triton" in name else []
    assert_verdict(cli("verify", str(EXAMPLES / name), *dtypes), code, verdict, text)


@pytest.mark.parametrize("name", sorted(WORLD_THREE))
def test_moe_collective_at_world_size_three(cli, name):
    code, verdict, text = WORLD_THREE[name]
    result = cli("verify", str(EXAMPLES / name), "--world-size", "3", "--dtype", "bfloat16", "--stability-calls", "200",
                 "--json")
    report = json.loads(result.stdout)
    assert result.returncode == code and report["verdict"] == verdict, result.stdout
    op = report["ops"][0]
    assert text in op["reason"] and op["confinement"]["world_size"] == "3"


def test_caching_cheat_passes_its_first_trial_and_fails_the_refill(cli):
    report = json.loads(cli("verify", str(EXAMPLES / "silu-cheat-caches-output"), "--json").stdout)
    cases = report["ops"][0]["cases"]
    assert [c["ok"] for c in cases] == [True, False]
    assert cases[1]["trial"] == 1


def test_scan_violation_is_never_executed(cli, tmp_path):
    marker = "/tmp/cacheon-scan-violation-ran"
    import os

    if os.path.exists(marker):
        os.remove(marker)
    scan = cli("scan", str(EXAMPLES / "silu-scan-violation"))
    assert scan.returncode == 2
    for rule in ("[not-allowed-import]", "[not-allowed-name]", "[not-allowed-attribute]"):
        assert rule in scan.stdout
    assert "kernels/silu_and_mul.py:7: [not-allowed-name] open" in scan.stdout
    result = cli("verify", str(EXAMPLES / "silu-scan-violation"), "--json")
    assert result.returncode == 2
    assert json.loads(result.stdout)["reason"] == "scan violations"
    assert "the bundle was not executed" in result.stderr
    assert not os.path.exists(marker)
