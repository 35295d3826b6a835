"""The one seam table is consistent with the slot catalog, the adapters and the collective probes."""

from __future__ import annotations

from cacheon.contract.catalog import SLOTS
from cacheon.runtime.activation import PROBES
from cacheon.runtime.adapters import _BY_PIN, adapter_for
from cacheon.runtime.pin import SGLANG_PIN
from cacheon.runtime.seams import NO_CALL_SITE, SEAMS, Gate, Standing, seams_for_slot, standing

REQUIRED = {
    "SiluAndMul",
    "RMSNorm",
    "RadixAttention",
    "FusedMoE",
    "GroupCoordinator.all_reduce",
    "ServerArgs",
    "Engine.generate",
}


def test_names_are_unique_and_the_issue_seams_are_covered():
    names = [s.name for s in SEAMS]
    assert len(names) == len(set(names))
    chokepoints = " ".join(s.chokepoint for s in SEAMS)
    assert all(symbol in chokepoints for symbol in REQUIRED)


def test_every_slot_named_by_a_seam_is_registered():
    assert {slot for s in SEAMS for slot in s.slots} <= set(SLOTS)


def test_the_pin_has_an_adapter_for_exactly_the_armable_seams():
    assert SGLANG_PIN in _BY_PIN
    adapter = adapter_for(SGLANG_PIN)
    assert adapter.PIN == SGLANG_PIN
    armable = {s.name for s in SEAMS if s.gate is not Gate.CHECK_ONLY}
    assert set(adapter.ARMERS) == armable


def test_every_all_ranks_seam_has_a_probe_and_every_probe_a_collective_slot():
    for seam in SEAMS:
        if seam.gate is Gate.ALL_RANKS:
            assert seam.slots and all(slot in PROBES for slot in seam.slots)
    assert all(SLOTS[slot].kind == "collective" for slot in PROBES)


def test_check_only_seams_are_never_armed():
    assert seams_for_slot("attention.sdpa") == ()
    assert [s.name for s in seams_for_slot("activation.silu_and_mul")] == ["activation.SiluAndMul"]


def test_every_slot_has_a_call_site_or_a_recorded_reason_why_the_pin_has_none():
    named = {slot for s in SEAMS for slot in s.slots}
    assert set(NO_CALL_SITE) <= set(SLOTS)
    assert not named & set(NO_CALL_SITE)  # a slot with a call site is never also "absent"
    assert named | set(NO_CALL_SITE) == set(SLOTS)  # and no slot is left unclassified


def test_the_four_new_slots_stand_as_the_pins_source_reads():
    expected = {
        "moe.fused_experts_reduce": (Standing.CHECKED_ONLY, ["moe.FusedMoE.forward_impl"]),
        "collective.moe_finalize_ar_rmsnorm": (Standing.NO_CALL_SITE, []),
        "attention.msa_block_score": (Standing.NO_CALL_SITE, []),
        "attention.msa_prefill_block_score": (Standing.NO_CALL_SITE, []),
    }
    for slot, (state, seams) in expected.items():
        got, rows, reason = standing(slot)
        assert (got, [s.name for s in rows]) == (state, seams), slot
        assert bool(reason) == (state is Standing.NO_CALL_SITE)
        assert seams_for_slot(slot) == ()  # verifiable, not armable at this pin
    assert standing("activation.silu_and_mul")[0] is Standing.ARMABLE


def test_cacheon_slots_says_what_the_pin_offers_each_slot(capsys):
    import argparse
    import json

    from cacheon.commands import slots as command

    assert command.run(argparse.Namespace(json=True)) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["slots"]) == 11 and data["runtime"]["sglang_pin"] == SGLANG_PIN
    runtime = data["runtime"]["slots"]
    assert set(runtime) == set(SLOTS)
    assert runtime["attention.msa_block_score"]["standing"] == "no_call_site"
    assert "dsa_indexer.py" in runtime["attention.msa_block_score"]["reason"]
    assert runtime["moe.fused_experts_reduce"] == {
        "standing": "call_site_checked", "armable": False, "seams": ["moe.FusedMoE.forward_impl"], "reason": ""}
    assert runtime["collective.all_reduce"]["armable"] is True
    assert command.run(argparse.Namespace(json=False)) == 0
    text = capsys.readouterr().out
    assert f"catalog {data['digest']}   11 slots" in text
    assert text.count(f"verifiable; not armable at sglang {SGLANG_PIN}: no call site (") == 3
    assert f"runtime: armable at sglang {SGLANG_PIN} (activation.SiluAndMul)" in text
    assert "FusedMoE.forward_impl is checked, no adapter arms it" in text
