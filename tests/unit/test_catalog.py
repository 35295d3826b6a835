import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from cacheon.contract import catalog, references
from cacheon.contract.inputs import derive_seed, jitter_case, make_inputs, output_layout
from cacheon.contract.spec import ShapeCase, eval_dim
from cacheon.errors import UsageError


def test_catalog_digest_is_stable_and_tracks_the_abi(monkeypatch):
    first = catalog.catalog_digest()
    assert first == catalog.catalog_digest()
    assert first.startswith("sha256:") and len(first) == 71
    changed = dataclasses.replace(catalog.SILU_AND_MUL, args=("out", "x"))
    monkeypatch.setitem(catalog.SLOTS, changed.name, changed)  # type: ignore[arg-type]
    assert catalog.catalog_digest() != first


def test_every_slot_declares_the_full_contract():
    for slot in catalog.SLOTS.values():
        described = slot.describe()
        assert described["signature"].startswith(slot.entry + "(")
        tensors = {t.name for t in (*slot.inputs, *slot.outputs)}
        harness_values = {"group"} if slot.kind == "collective" else set()
        harness_values |= {"prepared"} if slot.prepare_inputs else set()
        assert set(slot.args) == (tensors - set(slot.prepare_inputs)) | set(slot.scalar_names) | harness_values
        assert slot.shapes and slot.dtypes and slot.graph_dynamic
        for dtype in slot.dtypes:
            slot.comparator.tolerance(dtype)
        assert set(slot.graph_dynamic) <= {t.name for t in slot.inputs}


def test_unknown_slot_is_a_clear_error():
    with pytest.raises(UsageError, match=r"registered slots: activation\.silu_and_mul"):
        catalog.get_slot("activation.gelu")


def test_dimension_expressions():
    assert eval_dim("2*d", {"d": 7}) == 14
    assert eval_dim("P+T", {"P": 3, "T": 4}) == 7
    assert eval_dim("(T+Tpad)*K", {"T": 3, "Tpad": 5, "K": 2}) == 16
    with pytest.raises(ValueError):
        eval_dim("__import__('os')", {})


@pytest.mark.parametrize(("expr", "want"), [("S//bs", 17), ("cdiv(S, bs)", 18), ("cdiv(P+T,bs)", 18),
                                            ("cdiv(1024, bs)", 16), ("S//S", 1)])
def test_floor_and_ceiling_division(expr, want):
    assert eval_dim(expr, {"S": 1100, "bs": 64, "P": 1099, "T": 1}) == want


@pytest.mark.parametrize("expr", [
    "S/bs",  # true division is a float
    "S**2", "S%bs", "-S", "S if bs else 0", "S.real", "1.5", "True", "'a'", "",
    "cdiv(S)", "cdiv(S, bs, 1)", "cdiv(a=S, b=bs)", "cdiv(*S)", "max(S, bs)", "open(S)", "(lambda: S)()",
])
def test_dimension_expressions_refuse_everything_else(expr):
    with pytest.raises(ValueError, match="unsupported dimension expression"):
        eval_dim(expr, {"S": 1100, "bs": 64})


@pytest.mark.parametrize(("expr", "dims", "match"), [
    ("S//bs", {"S": 8, "bs": 0}, "divides by 0"),
    ("cdiv(S, bs-1)", {"S": 8, "bs": 1}, "divides by 0"),
    ("S//bs", {"S": 8, "bs": -2}, "divides by -2"),
    ("P-T", {"P": 1, "T": 4}, "is negative"),
])
def test_dimension_expressions_refuse_a_bad_division_or_a_negative_size(expr, dims, match):
    with pytest.raises(ValueError, match=match):
        eval_dim(expr, dims)


def test_inputs_are_deterministic_per_seed_and_differ_across_seeds():
    slot = catalog.RMSNORM
    case = slot.shapes[1]
    a = make_inputs(slot, case, "bfloat16", 7)
    b = make_inputs(slot, case, "bfloat16", 7)
    c = make_inputs(slot, case, "bfloat16", 8)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["x"], c["x"])
    assert a["x"].dtype == torch.bfloat16 and a["x"].shape == (7, 2880)
    assert output_layout(slot, case, "bfloat16") == {"out": ((7, 2880), torch.bfloat16)}
    assert derive_seed(1, "a") != derive_seed(1, "b")


def test_jitter_changes_only_the_token_dim():
    slot = catalog.ATTENTION_SDPA
    case = slot.shapes[1]
    jittered = jitter_case(slot, case, 3)
    assert jittered.dims["T"] != case.dims["T"] and jittered.dims["T"] >= 1
    assert {k: v for k, v in jittered.dims.items() if k != "T"} == {k: v for k, v in case.dims.items() if k != "T"}


def test_references_match_textbook_torch():
    x = torch.randn(5, 16, dtype=torch.float64)
    assert torch.allclose(references.silu_and_mul({"x": x}, {})["out"], F.silu(x[:, :8]) * x[:, 8:])
    w = torch.rand(16, dtype=torch.float64)
    got = references.rmsnorm({"x": x, "weight": w}, {"eps": 1e-6})["out"]
    assert torch.allclose(got, F.rms_norm(x, (16,), w, eps=1e-6))


@pytest.mark.parametrize("causal", [True, False])
def test_attention_reference_matches_sdpa_with_gqa_and_offset(causal):
    t, s, hq, hkv, d = 5, 9, 4, 2, 8
    q = torch.randn(t, hq, d, dtype=torch.float64)
    k = torch.randn(s, hkv, d, dtype=torch.float64)
    v = torch.randn(s, hkv, d, dtype=torch.float64)
    scale = 1 / math.sqrt(d)
    got = references.attention({"q": q, "k": k, "v": v}, {"sm_scale": scale, "causal": causal})["out"]
    mask = torch.ones(t, s, dtype=torch.bool).tril(diagonal=s - t) if causal else None
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=True
    ).transpose(0, 1)
    assert torch.allclose(got, want)


def test_shape_case_label():
    assert ShapeCase({"T": 1, "d": 2}, {"causal": True}).label() == "T=1 d=2 causal=True"
