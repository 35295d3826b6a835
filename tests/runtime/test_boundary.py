"""The harness-owned output check every armed call goes through, and the class patch it restores."""

from __future__ import annotations

import pytest
import torch

from cacheon.runtime.boundary import SeamViolation, call_entry, patch_attribute


def _fill(x, out):
    out.copy_(x)


def test_an_entry_that_fills_out_passes():
    x, out = torch.ones(3), torch.empty(3)
    assert call_entry(_fill, (x, out), out) is out and torch.equal(out, x)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (lambda x, out: x * 2, "returned a tensor"),
        (lambda x, out: out.set_(x.clone()), "replaced or reshaped"),
        (lambda x, out: out.resize_(6), "replaced or reshaped"),
        (lambda x, out: out.as_strided_((3,), (0,)), "replaced or reshaped"),
    ],
)
def test_an_entry_that_escapes_the_boundary_raises(entry, reason):
    out = torch.empty(3)
    with pytest.raises(SeamViolation, match=reason):
        call_entry(entry, (torch.ones(3), out), out)


def test_returning_out_itself_is_allowed():
    x, out = torch.ones(3), torch.empty(3)
    call_entry(lambda a, o: o.copy_(a), (x, out), out)


class Base:
    def forward(self):
        return "base"


class Own(Base):
    def forward(self):
        return "own"


class Inherits(Base):
    pass


def test_patch_restores_an_inherited_method_by_removing_the_shadow():
    restore = patch_attribute(Inherits, "forward", lambda self: "armed")
    assert Inherits().forward() == "armed"
    restore()
    assert "forward" not in Inherits.__dict__ and Inherits().forward() == "base"


def test_patch_restores_an_own_method_exactly():
    original = Own.__dict__["forward"]
    restore = patch_attribute(Own, "forward", lambda self: "armed")
    restore()
    assert Own.__dict__["forward"] is original
