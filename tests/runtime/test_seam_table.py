"""The one seam table is consistent with the slot catalog, the adapters and the collective probes."""

from __future__ import annotations

from cacheon.contract.catalog import SLOTS
from cacheon.runtime.activation import PROBES
from cacheon.runtime.adapters import _BY_PIN, adapter_for
from cacheon.runtime.pin import SGLANG_PIN
from cacheon.runtime.seams import SEAMS, Gate, seams_for_slot

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
