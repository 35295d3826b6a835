import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from cacheon.contract import catalog, references
from cacheon.contract.inputs import (
    derive_seed,
    input_elements,
    jitter_case,
    make_inputs,
    make_rank_inputs,
    output_layout,
    reference_inputs,
    with_tokens,
)
from cacheon.contract.spec import ShapeCase, eval_dim
from cacheon.errors import UsageError
from cacheon.verify.plan import STABILITY_ELEMENT_BUDGET, STABILITY_MAX_TOKENS, eager_cases, stability_plan


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


def test_the_catalog_registers_eleven_slots():
    assert sorted(catalog.SLOTS) == [
        "activation.silu_and_mul", "attention.decode", "attention.msa_block_score",
        "attention.msa_prefill_block_score", "attention.sdpa", "collective.all_reduce",
        "collective.ar_residual_rmsnorm", "collective.moe_finalize_ar_rmsnorm", "moe.fused_experts",
        "moe.fused_experts_reduce", "norm.rmsnorm",
    ]


SELECTIONS = [s for s in catalog.SLOTS.values() if s.comparator.mode == "topk_overlap"]


def _blocks_per_row(slot, case):
    (shape, _), = output_layout(slot, case, slot.dtypes[0]).values()
    return shape[-1]


@pytest.mark.parametrize("slot", SELECTIONS, ids=lambda s: s.name)
def test_every_selection_shape_keeps_comfortably_more_blocks_than_its_top_k(slot):
    """With k blocks or fewer in a row, any output would select them all: every registered, jittered,
    drawn and stability shape keeps at least 2k (the fewest tokens a draw reaches is 1)."""
    k = max(t.topk for t in slot.comparator.tolerances.values())
    assert k == catalog.SELECTION_TOPK
    for case in slot.shapes:
        assert _blocks_per_row(slot, with_tokens(slot, case, 1)) >= 2 * k, case.label()
    for seed in range(25):
        for dtype in slot.dtypes:
            for planned in eager_cases(slot, dtype, seed):
                assert _blocks_per_row(slot, planned.case) >= 2 * k, planned.case.label()
        for held in stability_plan(slot, list(slot.dtypes), seed, 10).sets:
            assert _blocks_per_row(slot, held.case) >= 2 * k, held.case.label()


NEW_SLOTS = [catalog.ATTENTION_MSA_BLOCK_SCORE, catalog.ATTENTION_MSA_PREFILL_BLOCK_SCORE,
             catalog.MOE_FUSED_EXPERTS_REDUCE, catalog.MOE_FINALIZE_AR_RMSNORM]


@pytest.mark.parametrize("slot", NEW_SLOTS, ids=lambda s: s.name)
def test_new_slots_have_a_cpu_sized_stability_case(slot):
    """The stability stage makes 1000 calls: each new slot registers a shape that stays small there."""
    fits = [c for c in slot.shapes
            if input_elements(slot, with_tokens(slot, c, STABILITY_MAX_TOKENS)) <= STABILITY_ELEMENT_BUDGET]
    assert fits


def test_key_lengths_span_one_to_s_and_the_row_map_is_a_permutation():
    slot = catalog.ATTENTION_MSA_BLOCK_SCORE
    case = with_tokens(slot, slot.shapes[1], 200)
    lens = make_inputs(slot, case, "float32", 3)["seq_lens"]
    assert lens.dtype == torch.int32 and int(lens.min()) >= 1 and int(lens.max()) == case.dims["S"]
    assert len(set(lens.tolist())) > 50  # lengths all over the range, not a few fixed ones
    fin = catalog.MOE_FINALIZE_AR_RMSNORM
    row_map = make_inputs(fin, fin.shapes[2], "float32", 3)["row_map"]
    assert row_map.dtype == torch.int32 and sorted(row_map.tolist()) == list(range(row_map.numel()))


def _msa_loops(q, k, lens, bs, blocks):
    out = torch.full((q.shape[0], blocks), -math.inf, dtype=torch.float64)
    for b in range(q.shape[0]):
        for n in range(min(int(lens[b]), blocks * bs)):
            score = float(sum(q[b, h] for h in range(q.shape[1])) @ k[b, n, 0])
            out[b, n // bs] = max(out[b, n // bs], score)
    return out


def test_msa_block_score_reference_matches_a_loop_over_keys():
    slot = catalog.ATTENTION_MSA_BLOCK_SCORE
    case = ShapeCase({"B": 3, "Hq": 3, "D": 8, "S": 37, "bs": 4})
    inputs = {k: v.double() if v.is_floating_point() else v for k, v in make_inputs(slot, case, "float32", 1).items()}
    got = references.msa_block_score(inputs, slot.scalars(case))["out"]
    assert got.shape == (3, 9)  # 37 // 4: keys 36.. belong to no block
    want = _msa_loops(inputs["q"], inputs["index_k"], inputs["seq_lens"], 4, 9)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.allclose(got[~got.isinf()], want[~want.isinf()])


def test_msa_prefill_reference_matches_a_loop_over_visible_keys():
    slot = catalog.ATTENTION_MSA_PREFILL_BLOCK_SCORE
    case = ShapeCase({"T": 6, "P": 9, "D": 8, "bs": 4})
    inputs = {k: v.double() for k, v in make_inputs(slot, case, "float32", 2).items()}
    scalars = slot.scalars(case)
    got = references.msa_prefill_block_score(inputs, scalars)["out"]
    assert got.shape == (6, 4)  # S = 15 keys: three whole blocks and a ragged one of 3
    want = torch.full((6, 4), -math.inf, dtype=torch.float64)
    for m in range(6):
        for n in range(9 + m + 1):
            want[m, n // 4] = max(want[m, n // 4], scalars["scale"] * float(inputs["q"][m] @ inputs["index_k"][n]))
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.allclose(got[~got.isinf()], want[~want.isinf()])
    assert torch.isinf(got[0, 3]) and not torch.isinf(got[-1, 3])  # the ragged block: visible to late rows only


def test_fused_experts_reference_is_the_gathered_textbook_formula():
    slot = catalog.MOE_FUSED_EXPERTS
    inputs = make_inputs(slot, slot.shapes[2], "float32", 4)
    x, w13, w2 = (inputs[n].double() for n in ("x", "w13", "w2"))
    ids, weights = inputs["topk_ids"].long(), inputs["topk_weights"].double()
    gate_up = torch.einsum("tkoh,th->tko", w13[ids], x)
    inter = w2.shape[-1]
    hidden = F.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    want = (weights.unsqueeze(-1) * torch.einsum("tkhi,tki->tkh", w2[ids], hidden)).sum(dim=1)
    assert torch.allclose(references.fused_experts(inputs, {})["out"], want)


def test_fused_experts_reduce_is_a_tensor_parallel_layer_split_over_ranks():
    """Each rank's (w13, w2) is a slice of one layer's intermediate dim: the sum over ranks is the layer."""
    slot = catalog.MOE_FUSED_EXPERTS_REDUCE
    case = ShapeCase({"T": 9, "E": 4, "K": 2, "H": 16, "I": 6})
    ranks = make_rank_inputs(slot, case, "float32", 5, 3)
    stacked = reference_inputs(slot, ranks)
    assert stacked["w13"].shape == (3, 4, 12, 16) and not torch.equal(ranks[0]["w13"], ranks[1]["w13"])
    gates = torch.cat([r["w13"][:, :6] for r in ranks], dim=1)
    ups = torch.cat([r["w13"][:, 6:] for r in ranks], dim=1)
    whole = {**ranks[0], "w13": torch.cat([gates, ups], dim=1), "w2": torch.cat([r["w2"] for r in ranks], dim=2)}
    got = references.fused_experts_reduce(stacked, {})["out"]
    assert torch.allclose(got, references.fused_experts(whole, {})["out"])


def test_moe_finalize_reference_reads_the_k_major_map_and_trims_the_padding():
    slot = catalog.MOE_FINALIZE_AR_RMSNORM
    case = ShapeCase({"T": 3, "Tpad": 2, "K": 2, "H": 8})
    ranks = make_rank_inputs(slot, case, "float32", 6, 2)
    got = references.moe_finalize_ar_rmsnorm(reference_inputs(slot, ranks), {"eps": 1e-6})
    want = ranks[0]["residual"].double().clone()
    for r in ranks:
        for t in range(3):
            for k in range(2):
                row = int(r["row_map"][t + k * 5])  # T_exp = 5
                want[t] += float(r["scales"][t, k]) * r["gemm_out"][row].double()
    assert torch.allclose(got["out_residual"], want)
    assert torch.allclose(got["out_norm"], F.rms_norm(want, (8,), ranks[0]["weight"].double(), eps=1e-6))
