"""Arming an admitted bundle into the live SGLang layer classes at the pin, and disarming it.

``activate`` reads the bundle once into a snapshot and admits it (manifest, scan, digest); every op
is then imported from those bytes, checked against the admitted digest, never from the path again.
It refuses anything it cannot arm completely
(a slot without an armable seam, a seam whose canary row is not ok, another SGLang version), then arms
every seam serving each op through the pin's adapter. Partial arming never survives: any failure
disarms what was armed. A process-group gate is armed too, so that in a multi-rank engine every rank
must have armed the same digest (see :mod:`cacheon.runtime.collective`).
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

from cacheon.bundle.admission import admit
from cacheon.bundle.loader import load_entry
from cacheon.errors import CacheonError
from cacheon.runtime.adapters import NoAdapter, adapter_for
from cacheon.runtime.boundary import ArmRequest, Disarm
from cacheon.runtime.collective import Claim, CollectiveAbort, GroupView, Probe, all_reduce_probe, enforce
from cacheon.runtime.receipts import Receipt
from cacheon.runtime.seams import seams_for_slot
from cacheon.runtime.surface import check_surface

#: TEST-ONLY: the digest of one bundle to arm although ``scan`` refused it. tests/engines sets it (through
#: cacheon.serving.confined's test-only request field) for hostile kernels, so the sandbox around the
#: server, not scan, is what those tests exercise. No command sets it.
TEST_ONLY_UNSCANNED_ENV = "CACHEON_TEST_ONLY_ADMIT_UNSCANNED_DIGEST"

logger = logging.getLogger("cacheon.activation")

# The call each collective slot must complete on every rank before any rank may use it.
PROBES = {"collective.all_reduce": all_reduce_probe}


class ActivationError(CacheonError):
    """The bundle cannot be armed completely here; nothing was left armed."""


@dataclass
class Activation:
    """What is armed in this process; ``disarm()`` restores stock SGLang."""

    bundle_id: str | None
    claim: Claim
    receipts: dict[str, Receipt] = field(default_factory=dict)
    _disarms: list[Disarm] = field(default_factory=list)

    @property
    def digest(self) -> str | None:
        return self.claim.digest

    def enforce(self, view: GroupView) -> None:
        """The group gate: agree with every rank, or disarm here and abort."""
        try:
            enforce(self.claim, view)
        except CollectiveAbort:
            self.disarm()
            raise

    def disarm(self) -> None:
        global _ACTIVE
        while self._disarms:
            self._disarms.pop()()
        for receipt in self.receipts.values():
            receipt.write()
        if _ACTIVE is self:
            _ACTIVE = None

    def __enter__(self) -> Activation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disarm()


_ACTIVE: Activation | None = None


def active() -> Activation | None:
    return _ACTIVE


def activate(
    bundle_dir: Path | str, *, expected_digest: str | None = None, receipt_dir: Path | None = None
) -> Activation:
    """Arm every op of the bundle at ``bundle_dir`` into the installed SGLang (which must be the pin)."""
    adapter = _installed_adapter()
    root = Path(bundle_dir)
    admission = admit(root)
    if not admission.admitted and not _test_only_unscanned(admission.digest):
        first = admission.scan.findings[0] if admission.scan.findings else "no detail"
        raise ActivationError(f"{root}: scan did not admit the bundle ({first})")
    digest = admission.digest
    if digest is None:
        raise ActivationError(f"{root}: the bundle has no content digest")
    if expected_digest is not None and digest != expected_digest:
        raise ActivationError(f"{root}: digest {digest} is not the expected {expected_digest}")
    manifest = admission.manifest
    activation = Activation(manifest.bundle_id, Claim(digest))
    _claim_process(activation)
    try:
        probe: Probe | None = None
        for op in manifest.ops:
            seams = seams_for_slot(op.slot)
            if not seams:
                raise ActivationError(f"slot {op.slot} has no armable seam at sglang {adapter.PIN}")
            entry = load_entry(admission.snapshot, op, digest=digest)
            dtypes = frozenset(getattr(torch, name) for name in op.dtypes)
            for seam in seams:
                row = check_surface(seam)
                if row.status != "ok":
                    raise ActivationError(f"seam {seam.name} is {row.status}: {row.detail}")
                receipt = Receipt(seam.name, op.slot, manifest.bundle_id, digest, receipt_dir)
                activation._disarms.append(adapter.ARMERS[seam.name](ArmRequest(entry, receipt, dtypes)))
                activation.receipts[seam.name] = receipt
            if op.slot in PROBES:
                probe = PROBES[op.slot](entry)
        activation.claim = Claim(digest, probe=probe)
        activation._disarms.append(adapter.arm_group_gate(activation.enforce))
    except BaseException:
        activation.disarm()
        raise
    return activation


def _test_only_unscanned(digest: str | None) -> bool:
    wanted = os.environ.get(TEST_ONLY_UNSCANNED_ENV, "").strip()
    if not wanted or digest != wanted:
        return False
    logger.warning("cacheon: TEST-ONLY: arming %s although scan refused it (%s)", digest, TEST_ONLY_UNSCANNED_ENV)
    return True


def refuse(reason: str) -> Activation:
    """Arm only the group gate, claiming failure: every multi-rank group created in this process makes
    every rank abort, and any group created here raises. Used when a rank could not arm its bundle, so
    peers learn it at the next rendezvous instead of waiting on a dead process."""
    adapter = _installed_adapter()
    activation = Activation(None, Claim(None, error=reason))
    _claim_process(activation)
    activation._disarms.append(adapter.arm_group_gate(activation.enforce))
    return activation


def _claim_process(activation: Activation) -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        raise ActivationError(f"bundle {_ACTIVE.bundle_id or '(refused)'} is already armed here; disarm it first")
    _ACTIVE = activation


def _installed_adapter() -> ModuleType:
    try:
        version = importlib.import_module("sglang").__version__
    except Exception as exc:
        raise ActivationError(f"sglang cannot be imported: {type(exc).__name__}: {exc}") from None
    try:
        return adapter_for(version)
    except NoAdapter as exc:
        raise ActivationError(str(exc)) from None
