"""Seam activation, behaviourally, in the REAL SGLang layer classes at the pin on CPU.

Unarmed = stock; an exact-math bundle = byte-identical to stock (fp32, where the example bundles do the
same arithmetic as SGLang's forward_native); a broken bundle = corrupted output, and its receipt proves
the adapter path ran (a faithful bundle alone cannot prove that). Disarming restores stock.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from cacheon.bundle.admission import admit
from cacheon.runtime import activation as act_mod
from cacheon.runtime import plugin
from cacheon.runtime.activation import ActivationError, activate
from cacheon.runtime.boundary import SeamViolation
from cacheon.runtime.receipts import read_receipts
from tests.runtime.sglang_tier import EXAMPLES, sglang_or_skip

pytestmark = pytest.mark.slow  # the pinned SGLang's layers

SILU, NORM = "activation.SiluAndMul", "layernorm.RMSNorm"


@pytest.fixture(scope="module")
def layers():
    sglang_or_skip()
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    # SiluAndMul reads the global server args; "dummy" is SGLang's own no-model short-circuit (any other
    # path probes for an accelerator and fetches the model config).
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(96, generator=gen) + 0.5)
    x = {SILU: torch.randn(7, 2 * 80, generator=gen), NORM: torch.randn(7, 96, generator=gen)}
    return {SILU: SiluAndMul(), NORM: norm}, x


@pytest.fixture(autouse=True)
def nothing_left_armed():
    yield
    armed = act_mod.active()
    if armed is not None:
        armed.disarm()
        pytest.fail("a test left a bundle armed")


def _stock(layers, seam):
    modules, x = layers
    return modules[seam].forward_native(x[seam])


def test_unarmed_layers_compute_stock(layers):
    modules, x = layers
    for seam in (SILU, NORM):
        assert "forward" not in type(modules[seam]).__dict__  # the inherited MultiPlatformOp dispatch
        assert torch.equal(modules[seam](x[seam]), _stock(layers, seam))


@pytest.mark.parametrize(("bundle", "seam"), [("silu-torch", SILU), ("rmsnorm-torch", NORM)])
def test_exact_bundle_is_byte_identical_to_stock_and_leaves_a_receipt(layers, bundle, seam, tmp_path):
    modules, x = layers
    with activate(EXAMPLES / bundle, receipt_dir=tmp_path) as armed:
        assert torch.equal(modules[seam](x[seam]), _stock(layers, seam))
        assert torch.equal(modules[seam](x[seam]), _stock(layers, seam))
        receipt = armed.receipts[seam]
        assert (receipt.fired, receipt.passthrough) == (2, 0)
    assert read_receipts(tmp_path) == [receipt.to_json()]  # written on first fire, rewritten on disarm


@pytest.mark.parametrize(("bundle", "seam"), [("silu-broken-no-silu", SILU), ("rmsnorm-broken-no-norm", NORM)])
def test_broken_bundle_corrupts_output_and_its_receipt_proves_the_path_ran(layers, bundle, seam):
    modules, x = layers
    with activate(EXAMPLES / bundle) as armed:
        y = modules[seam](x[seam])
        assert armed.receipts[seam].fired == 1
    assert not torch.allclose(y, _stock(layers, seam), atol=1e-2)
    # Disarmed: the same layer object computes stock again.
    assert torch.equal(modules[seam](x[seam]), _stock(layers, seam))


def test_leading_dimensions_are_flattened_for_the_slot_and_restored(layers):
    modules, _ = layers
    x = torch.randn(2, 3, 2 * 16)
    with activate(EXAMPLES / "silu-torch") as armed:
        y = modules[SILU](x)
        assert armed.receipts[SILU].fired == 1
    assert y.shape == (2, 3, 16) and torch.equal(y, modules[SILU].forward_native(x))


def test_calls_outside_the_slot_contract_go_to_stock_and_are_counted(layers):
    modules, x = layers
    residual = torch.randn_like(x[NORM])
    with activate(EXAMPLES / "rmsnorm-broken-no-norm") as armed:
        y, r = modules[NORM](x[NORM], residual)  # fused add + norm is not the norm.rmsnorm slot
        receipt = armed.receipts[NORM]
        assert (receipt.fired, receipt.passthrough) == (0, 1)
    y_stock, r_stock = modules[NORM].forward_native(x[NORM], residual)
    assert torch.equal(y, y_stock) and torch.equal(r, r_stock)


def test_a_bundle_that_replaces_out_raises_inside_the_layer(layers):
    modules, x = layers
    with activate(EXAMPLES / "silu-cheat-replaces-out"), pytest.raises(SeamViolation, match="replaced"):
        modules[SILU](x[SILU])


@pytest.mark.parametrize(
    ("bundle", "expected_digest", "reason"),
    [
        ("silu-scan-violation", None, "scan did not admit"),
        ("silu-torch", "sha256:" + "0" * 64, "is not the expected"),
        ("attention-torch", None, "slot attention.sdpa has no armable seam"),
    ],
)
def test_refusals_leave_nothing_armed(layers, bundle, expected_digest, reason):
    modules, _ = layers
    with pytest.raises(ActivationError, match=reason):
        activate(EXAMPLES / bundle, expected_digest=expected_digest)
    assert act_mod.active() is None
    assert "forward" not in type(modules[SILU]).__dict__


def test_one_bundle_at_a_time(layers):
    with activate(EXAMPLES / "silu-torch"), pytest.raises(ActivationError, match="already armed"):
        activate(EXAMPLES / "rmsnorm-torch")


def test_the_plugin_arms_the_bundle_named_by_the_environment(layers, monkeypatch, tmp_path):
    modules, x = layers
    monkeypatch.setenv(plugin.BUNDLE_ENV, str(EXAMPLES / "silu-broken-no-silu"))
    monkeypatch.setenv(plugin.RECEIPT_DIR_ENV, str(tmp_path))
    plugin.load()
    armed = act_mod.active()
    assert armed is not None and armed.bundle_id == "silu-broken-no-silu"
    try:
        assert not torch.allclose(modules[SILU](x[SILU]), _stock(layers, SILU), atol=1e-2)
        (receipt,) = read_receipts(tmp_path)
        assert receipt["seam"] == SILU and receipt["fired"] == 1 and receipt["bundle_digest"] == armed.digest
    finally:
        armed.disarm()


def _silu_copy(tmp_path):
    root = tmp_path / "bundle"
    shutil.copytree(EXAMPLES / "silu-torch", root)
    return root


def test_a_source_swapped_between_admission_and_import_is_not_what_is_armed(layers, tmp_path, monkeypatch):
    modules, x = layers
    root = _silu_copy(tmp_path)
    admitted = admit(root).digest
    real = act_mod.load_entry

    def swap_then_load(*args, **kwargs):  # after activate() admitted the bundle, before it imports it
        (root / "kernels" / "silu_and_mul.py").write_text("def silu_and_mul(x, out):\n    out.zero_()\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(act_mod, "load_entry", swap_then_load)
    with activate(root) as armed:
        assert armed.digest == admitted
        assert torch.equal(modules[SILU](x[SILU]), _stock(layers, SILU))  # the admitted bytes run, not zeros


def test_bytes_changed_after_verify_are_refused_by_the_admitted_digest(layers, tmp_path, monkeypatch):
    root = _silu_copy(tmp_path)
    verified = admit(root).digest  # what `cacheon verify` recorded
    (root / "kernels" / "silu_and_mul.py").write_text("def silu_and_mul(x, out):\n    out.zero_()\n")
    with pytest.raises(ActivationError, match=f"is not the expected {verified}"):
        activate(root, expected_digest=verified)
    assert act_mod.active() is None
    monkeypatch.setenv(plugin.BUNDLE_ENV, str(root))
    monkeypatch.setenv(plugin.DIGEST_ENV, str(verified))
    refused = plugin.arm_from_environment()  # serving: a refusal is armed, never the changed bytes
    assert refused is not None and refused.digest is None and not refused.receipts
    refused.disarm()
