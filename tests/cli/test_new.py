"""`cacheon new`: a starter bundle for every registered slot, green under `scan` and `verify` as written."""

from __future__ import annotations

import json

import pytest

from cacheon import starters
from cacheon.bundle.snapshot import read_snapshot
from cacheon.contract.catalog import SLOTS
from tests.conftest import EXAMPLES

# examples/bundles/<name> is `cacheon new <slot> examples/bundles/<name>`, byte for byte: the starter is its source
EXAMPLE_OF = {
    "silu-torch": "activation.silu_and_mul",
    "rmsnorm-torch": "norm.rmsnorm",
    "attention-torch": "attention.sdpa",
    "decode-torch": "attention.decode",
    "moe-torch": "moe.fused_experts",
    "allreduce-torch": "collective.all_reduce",
    "ar-rmsnorm-torch": "collective.ar_residual_rmsnorm",
    "msa-block-torch": "attention.msa_block_score",
    "msa-prefill-torch": "attention.msa_prefill_block_score",
    "moe-reduce-torch": "moe.fused_experts_reduce",
    "moe-finalize-torch": "collective.moe_finalize_ar_rmsnorm",
}


def test_every_registered_slot_has_a_starter():
    missing = starters.missing()
    assert not missing, (
        f"slots without a starter kernel: {', '.join(missing)}; add src/cacheon/starters/kernels/"
        f"{starters.kernel_file(SLOTS[missing[0]])} (a plain torch kernel that passes `cacheon verify`)"
    )


@pytest.mark.parametrize("name", sorted(EXAMPLE_OF))
def test_the_example_is_the_starter_as_written(name):
    """One source for the kernel text: regenerate with `cacheon new SLOT examples/bundles/NAME --force`."""
    root = EXAMPLES / name
    written = starters.starter(EXAMPLE_OF[name]).files(name)
    on_disk = {rel: data.decode() for rel, data in read_snapshot(root).files.items()}
    assert on_disk == written, f"examples/bundles/{name} drifted from its starter: rerun `cacheon new " \
        f"{EXAMPLE_OF[name]} examples/bundles/{name} --force`"


@pytest.mark.slow  # the CLI and a sandboxed candidate per slot
@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_new_then_scan_and_verify_pass(cli, tmp_path, slot):
    """For every slot of the catalog: a slot without a starter fails here with where to add one."""
    bundle = tmp_path / "first-bundle"
    made = cli("new", slot, str(bundle), "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["slot"] == slot
    scan = cli("scan", str(bundle))
    assert scan.returncode == 0 and scan.stdout.rstrip().endswith("clean"), scan.stdout + scan.stderr
    # affordable: one dtype and a short stability stage; collectives at the default world size of 2
    verify = cli("verify", str(bundle), "--dtype", "float32", "--stability-calls", "16", "--json")
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr
    report = json.loads(verify.stdout)
    assert report["verdict"] in ("PASS", "NUMERICAL_PASS") and report["ops"][0]["slot"] == slot


def test_a_slot_without_a_starter_is_named_with_where_to_add_it(monkeypatch, tmp_path, capsys):
    from cacheon.cli import main

    monkeypatch.setattr(starters, "kernel_file", lambda slot: "no-such-starter.py")
    assert main(["new", "norm.rmsnorm", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cacheon new: error: slot norm.rmsnorm has no starter kernel yet: add "
                   "src/cacheon/starters/kernels/no-such-starter.py (a plain torch rmsnorm(x, weight, out, eps) "
                   "that passes `cacheon verify`)"]
    assert not (tmp_path / "b").exists()
    assert starters.missing() == sorted(SLOTS)  # and the catalog test above would list every slot


def test_new_keeps_what_is_there(cli_main, tmp_path):
    bundle = tmp_path / "mine"
    assert cli_main("new", "activation.silu_and_mul", str(bundle)).code == 0
    kernel = bundle / "kernels" / "silu_and_mul.py"
    kernel.write_text("# my work in progress\n")
    again = cli_main("new", "activation.silu_and_mul", str(bundle))
    assert again.code == 1 and "exists and is not empty; add --force" in again.err
    assert kernel.read_text() == "# my work in progress\n"
    forced = cli_main("new", "activation.silu_and_mul", str(bundle), "--force", "--bundle-id", "other")
    assert forced.code == 0 and kernel.read_text() == starters.starter("activation.silu_and_mul").kernel
    assert 'bundle_id = "other"' in (bundle / "manifest.toml").read_text()
