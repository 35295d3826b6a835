"""Model profiles: a model's specialisation of a slot (constants, reference, tolerances, input
ranges) that keeps the slot's ABI. ``verify --model KEY`` judges a bundle against the profile."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cacheon.contract import catalog
from cacheon.contract.spec import ShapeCase, SlotSpec, TensorSpec
from cacheon.errors import UsageError


@dataclass(frozen=True)
class Profile:
    key: str
    model: str
    summary: str
    #: slot name -> function producing the specialised slot from the stock one
    overrides: Mapping[str, Callable[[SlotSpec], SlotSpec]]


def _gpt_oss_constants(case: ShapeCase) -> dict[str, Any]:
    return {"alpha": 1.702, "limit": 7.0}


def _gpt_oss_activation(slot: SlotSpec) -> SlotSpec:
    """GPT-OSS's clamped SwiGLU behind the unchanged ``silu_and_mul(x, out)`` entry. Inputs are
    wide (σ = 4) so the ±7 clamp is exercised; the constants are the profile's, not arguments."""
    return dataclasses.replace(
        slot,
        inputs=(TensorSpec("x", ("T", "2*d"), init="wide_normal"),),
        reference_id="cacheon.contract.references.gpt_oss_swiglu@float64(alpha=1.702,limit=7.0)",
        scalars=_gpt_oss_constants,
        summary="GPT-OSS SwiGLU: g = min(x[:, :d], 7); u = clip(x[:, d:], ±7); out = g·σ(1.702·g)·(u + 1)",
    )


PROFILES: Mapping[str, Profile] = {
    p.key: p
    for p in (
        Profile(
            key="gpt-oss",
            model="openai/gpt-oss-20b, openai/gpt-oss-120b",
            summary="clamped SwiGLU activation (alpha 1.702, limit 7.0) in activation.silu_and_mul",
            overrides={catalog.SILU_AND_MUL.name: _gpt_oss_activation},
        ),
    )
}


def get_profile(key: str) -> Profile:
    try:
        return PROFILES[key]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise UsageError(f"unknown model profile {key!r}; known profiles: {known}") from None


def apply_profile(slot: SlotSpec, profile: Profile) -> SlotSpec:
    """The slot as the profile's model needs it; the ABI (entry, args, outputs) cannot change."""
    override = profile.overrides.get(slot.name)
    if override is None:
        return slot
    special = override(slot)
    if (special.entry, special.args, special.outputs) != (slot.entry, slot.args, slot.outputs):
        raise ValueError(f"profile {profile.key} would change the ABI of {slot.name}")
    return special
