"""The cheat corpus (examples/adversarial) and the verification-depth examples: each verdict and
reason asserted through the real CLI, plus the runtime layer proven with the scan bypassed."""

import json
import shutil
from pathlib import Path

import pytest

from cacheon.bundle.manifest import load_manifest
from cacheon.bundle.snapshot import read_snapshot
from cacheon.verify.runner import VerifyOptions, verify_bundle
from tests.conftest import EXAMPLES, REPO, assert_verdict, write_bundle

pytestmark = pytest.mark.slow  # every bundle through the CLI and candidate children

ADVERSARIAL = REPO / "examples" / "adversarial"

# bundle -> (exit code, verdict, reason text); CPU verdicts (graph cheats need CUDA: scripts/gpu_check.sh)
EXPECTED = {
    "cache-by-pointer": (2, "FAIL", "#1: output out"),
    "out-strides": (2, "FAIL", "shape/stride/dtype changed"),
    "returns-nan": (2, "FAIL", "non-finite values"),
    "low-precision": (2, "FAIL", "eager float32"),
    "detects-harness-env": (2, "FAIL", "[not-allowed-import] os is not importable"),
    "detects-harness-gc": (2, "FAIL", "[not-allowed-import] gc is not importable"),
    "patches-allclose": (2, "FAIL", "[attribute-assignment] assignment to torch.allclose"),
    "patches-tensor-eq": (2, "FAIL", "[private-attribute] torch.Tensor.__eq__"),
    "forges-verdict": (2, "FAIL", "candidate output (untrusted)"),
    "graph-stale-replay": (0, "NUMERICAL_PASS", "CUDA-graph replay proof not run"),
    # Cheats that read the harness; each got NUMERICAL_PASS from the verifier before issue 11 (constant
    # NaN poison, shapes up to 501 tokens, at most 48 calls per op). Poison drawn per call, shapes
    # drawn across the serving range and the stability stage catch them.
    "detects-poison": (2, "FAIL", "output out"),
    "shape-specialised": (2, "FAIL", "elements outside tolerance"),
    "first-calls-right": (2, "FAIL", "first: stability"),
    # Selections (topk_overlap): -inf is legitimate only where the reference masks. Masking the visible
    # blocks outside the top-8 keeps the top-8 intact, so an overlap alone passes it (it does with the
    # mask check removed); leaving masked blocks unwritten is right only when a call's poison is -inf.
    "selection-masks-low-blocks": (2, "FAIL", "-inf where the reference is finite"),
    "selection-leaves-masked-unwritten": (2, "FAIL", "output out"),
    # One snapshot (issue 20 part 2): a symlinked directory is refused by the read, nothing behind it copied.
    "snapshot-symlinked-dir": (2, "FAIL", "notes:0: [symlink]"),
    # Scan evasions of issue 20, each numerically faithful: the kernel language refuses them before any runs.
    "scan-match-case": (2, "FAIL", "[not-allowed-syntax] match statement"),
    "scan-stdlib-reexport": (2, "FAIL", "[not-allowed-attribute] typing.re"),
    "scan-decorator-attrwrite": (2, "FAIL", "[not-allowed-import] functools"),
    "scan-annotation-eval": (2, "FAIL", "[annotation]"),
    "scan-private-member": (2, "FAIL", "[private-attribute] torch._C"),
    "scan-numpy-ctypes": (2, "FAIL", "[not-allowed-attribute] out.numpy"),
    "scan-reseed": (2, "FAIL", "[not-allowed-attribute] torch.manual_seed"),
    "scan-budget": (2, "FAIL", "[scan-budget]"),
    # Cheats that tell the harness from serving (issue 20, part 4): each got NUMERICAL_PASS before it
    # (no_grad, a process group, varied depth, stale-data poison, serving counts, heavy tails, every
    # stability call judged); the caching ones were already caught by the refill trial.
    "harness-grad-mode": (2, "FAIL", "[not-allowed-attribute] torch.is_grad_enabled"),
    "harness-no-process-group": (2, "FAIL", "elements outside tolerance"),
    "harness-shallow-stack": (2, "FAIL", "[not-allowed-name] RecursionError"),
    "harness-gaussian-poison": (2, "FAIL", "output out"),
    "harness-chunked-prefill-sizes": (2, "FAIL", "T=8192"),
    "harness-heavy-tail": (2, "FAIL", "elements outside tolerance"),
    "harness-one-in-eight": (2, "FAIL", "first: stability"),
    "harness-cache-by-id": (2, "FAIL", "[not-allowed-name] id"),
    "harness-batch-and-skip": (2, "FAIL", "output out"),
    "harness-stale-own": (2, "FAIL", "output out"),  # found attacking the stale-data poison itself
    "harness-timer-patch": (2, "FAIL", "[attribute-assignment]"),
    # Attacks on the parent through the channel and the output (issue 20, part 3). Those that need the
    # channel's fd or a clock are refused by the scan; CHANNEL_RUNTIME runs them with the scan bypassed.
    "channel-stops-mid-frame": (2, "FAIL", "[not-allowed-import]"),
    "channel-slow-under-budget": (2, "FAIL", "[not-allowed-import]"),
    "channel-forged-shape": (2, "FAIL", "[not-allowed-import]"),
    "channel-floods-output": (0, "NUMERICAL_PASS", "earlier bytes not kept"),
    "channel-huge-reason": (2, "FAIL", "entry raised: ValueError: xxx"),
    "channel-escape-bytes": (2, "FAIL", "ValueError: \\x1b[32mPASS\\x1b[0m \\u202eevil"),
}
# with the scan bypassed: each ends, within small deadlines, in a FAIL that names what the parent refused
CHANNEL_RUNTIME = {
    "channel-stops-mid-frame": ("candidate timeout", "stopped mid-frame, after 5 bytes"),
    "channel-slow-under-budget": ("candidate timeout", "no answer within the op's 8s (--op-timeout)"),
    "channel-forged-shape": ("malformed result", "where float32 [1, 1024] was allocated"),
}


def test_every_adversarial_bundle_has_an_expectation():
    assert {p.name for p in ADVERSARIAL.iterdir()} == set(EXPECTED)


# bundle -> (link name, target): links are made at run time, never committed (a committed link dangles or,
# resolved from a fresh clone's location, points wherever that clone's parent holds)
LINKED = {"snapshot-symlinked-dir": ("notes", EXAMPLES / "silu-torch" / "kernels")}  # a host directory


def adversarial_bundle(name: str, tmp_path: Path) -> Path:
    """The corpus bundle ``name`` as verify sees it: a copy with its link, for the bundles that carry one."""
    if name not in LINKED:
        return ADVERSARIAL / name
    link, target = LINKED[name]
    copy = shutil.copytree(ADVERSARIAL / name, tmp_path / name)
    (copy / link).symlink_to(target.resolve(), target_is_directory=True)
    return copy


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_adversarial_verdict(cli, name, tmp_path):
    code, verdict, text = EXPECTED[name]
    assert_verdict(cli("verify", str(adversarial_bundle(name, tmp_path)), "--dtype", "float32"), code, verdict, text)


# Bundles the kernel language refuses, run with the scan bypassed: the harness still catches each
# (defense in depth: the scan is not the only guard). name -> what the FAIL reason must say.
BEYOND_THE_SCAN = {
    "patches-allclose": "elements outside tolerance|non-finite",
    "patches-tensor-eq": "elements outside tolerance|non-finite",
    "detects-harness-env": "elements outside tolerance|non-finite",
    "detects-harness-gc": "elements outside tolerance|non-finite",
    "harness-timer-patch": "elements outside tolerance|non-finite",
    "harness-grad-mode": "elements outside tolerance|non-finite",
    "harness-shallow-stack": "elements outside tolerance|non-finite",
    "harness-cache-by-id": "output out",
}


@pytest.mark.parametrize("name", sorted(BEYOND_THE_SCAN))
def test_runtime_layer_holds_without_the_scan(name):
    """Library call without admission: the child's tricks cannot reach the parent's judgement."""
    root = ADVERSARIAL / name
    report = verify_bundle(snapshot := read_snapshot(root), load_manifest(snapshot), VerifyOptions(dtypes=("float32",)))
    assert report.verdict == "FAIL", report.reason
    assert any(text in report.reason for text in BEYOND_THE_SCAN[name].split("|")), report.reason


@pytest.mark.parametrize("name", sorted(CHANNEL_RUNTIME))
def test_channel_attacks_hold_without_the_scan(name):
    root = ADVERSARIAL / name
    options = VerifyOptions(dtypes=("float32",), case="float32/r0", timeout=60.0, op_timeout=8.0)
    report = verify_bundle(snapshot := read_snapshot(root), load_manifest(snapshot), options)
    assert report.verdict == "FAIL" and all(text in report.reason for text in CHANNEL_RUNTIME[name]), report.reason


def test_channel_output_and_reasons_are_bounded_and_escaped(cli):
    flood = cli("verify", str(ADVERSARIAL / "channel-floods-output"), "--dtype", "float32", "--case", "float32/r0",
                "--json")
    op = json.loads(flood.stdout)["ops"][0]
    assert op["candidate_output_bytes"] > 1 << 30 and len(op["candidate_output"]) < 16 << 10
    for name in ("channel-huge-reason", "channel-escape-bytes"):
        shown = cli("verify", str(ADVERSARIAL / name), "--dtype", "float32", "--debug")
        assert len(shown.stdout) < 256 << 10 and not any(ch in shown.stdout for ch in "\x1b\x07\u202e")


def test_forged_output_is_shown_as_untrusted_and_ignored(cli):
    report = json.loads(cli("verify", str(ADVERSARIAL / "forges-verdict"), "--json").stdout)
    assert report["verdict"] == "FAIL"
    assert '{"verdict": "PASS"}' in report["ops"][0]["candidate_output"]


def test_confinement_is_reported(cli):
    report = json.loads(cli("verify", str(EXAMPLES / "silu-torch"), "--dtype", "float32", "--json").stdout)
    assert report["confinement"] == "bubblewrap"
    applied = report["ops"][0]["confinement"]
    assert applied["confinement"] == "bubblewrap" and applied["uid"] == "65534"
    assert applied["capabilities"] == "CapPrm=0 CapEff=0 CapAmb=0"
    assert int(applied["processes"]) == 256 and int(applied["open_files"]) <= 1024


DEPTH = {
    "allreduce-torch": (0, "PASS", "cases matched"),
    "allreduce-broken-local": (2, "FAIL", "rank 0: output out"),
    "allreduce-broken-fp16": (2, "FAIL", "collective float32"),
    "ar-rmsnorm-torch": (0, "PASS", "cases matched"),
    "ar-rmsnorm-broken-no-residual": (2, "FAIL", "output out_norm"),
    "decode-torch": (0, "NUMERICAL_PASS", "CUDA-graph replay proof not run"),
    "decode-broken-ignores-lens": (2, "FAIL", "elements outside tolerance"),
    "moe-torch": (0, "PASS", "cases matched"),
    "moe-broken-unweighted": (2, "FAIL", "matched ratio"),
}


@pytest.mark.parametrize("name", sorted(DEPTH))
def test_depth_example_verdict(cli, name):
    code, verdict, text = DEPTH[name]
    assert_verdict(cli("verify", str(EXAMPLES / name), "--dtype", "float32"), code, verdict, text)


def test_collective_world_size_three_and_refusals(cli, tmp_path):
    result = cli("verify", str(EXAMPLES / "allreduce-torch"), "--dtype", "float32", "--world-size", "3", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ops"][0]["confinement"]["world_size"] == "3"
    for args, text in [
        (("--world-size", "1"), "needs at least 2 ranks"),
        (("--world-size", "2", "--device", "cuda"), "no CUDA device"),
    ]:
        refused = cli("verify", str(EXAMPLES / "allreduce-torch"), *args)
        assert refused.returncode == 1 and text in refused.stderr, refused.stderr
    other = cli("verify", str(EXAMPLES / "silu-torch"), "--world-size", "2")
    assert other.returncode == 1 and "collective slots only" in other.stderr


def test_a_hanging_rank_fails_the_whole_group(cli, tmp_path):
    write_bundle(
        tmp_path, "collective.all_reduce", "all_reduce",
        "import torch.distributed as dist\n\n\ndef all_reduce(x, out, group):\n"
        "    out.copy_(x)\n    if dist.get_rank(group) == 0:\n        dist.all_reduce(out, group=group)\n",
    )
    result = cli("verify", str(tmp_path), "--timeout", "5")
    assert result.returncode == 2
    assert "candidate timeout: rank 0: no answer within 5s" in result.stdout


@pytest.mark.parametrize(
    ("bundle", "model", "code"),
    [("silu-gptoss-torch", "gpt-oss", 0), ("silu-torch", "gpt-oss", 2), ("silu-gptoss-torch", None, 2)],
)
def test_model_profile_specialises_the_slot(cli, bundle, model, code):
    args = ["verify", str(EXAMPLES / bundle), "--dtype", "float32"] + (["--model", model] if model else [])
    result = cli(*args)
    assert result.returncode == code, result.stdout + result.stderr
    if model:
        assert f"model profile: {model}" in result.stdout


def test_unknown_model_profile_lists_the_known_ones(cli):
    result = cli("verify", str(EXAMPLES / "silu-torch"), "--model", "llama-9")
    assert result.returncode == 1 and "known profiles: gpt-oss" in result.stderr


def test_prepare_is_required_exactly_where_the_slot_has_one(tmp_path):
    from cacheon.errors import UsageError

    root = Path(tmp_path)
    (root / "k.py").write_text("def f():\n    pass\n")
    (root / "manifest.toml").write_text(
        'bundle_id = "p"\nabi_version = "cacheon-op-abi-v1"\n[[ops]]\nslot = "moe.fused_experts"\nsource = "k.py"\nentry = "f"\n'
    )
    with pytest.raises(UsageError, match=r"ops\[0\]\.prepare: missing"):
        load_manifest(root)
