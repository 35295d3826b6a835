"""SGLang general plugin (entry-point group ``sglang.srt.plugins``): arm the bundle named by
``$CACHEON_BUNDLE`` in every SGLang process.

SGLang 0.5.13.post1 calls ``load_plugins()`` in the engine process and at the start of every scheduler
process (one per tensor-parallel rank), and calls each plugin with no arguments. Optional:
``$CACHEON_BUNDLE_DIGEST`` (the digest ``verify`` recorded: any other content is refused; without it a
warning is logged and the directory's current content is armed) and ``$CACHEON_RECEIPT_DIR`` (receipts
as JSON).

A rank that cannot arm does not exit on the spot: ``load_plugins`` swallows exceptions, and a rank
that dies before the distributed rendezvous leaves its peers waiting. It arms a refusal instead, so the
first process group it joins makes every rank abort (see :mod:`cacheon.runtime.collective`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cacheon.runtime.activation import Activation, activate, active, refuse

BUNDLE_ENV = "CACHEON_BUNDLE"
DIGEST_ENV = "CACHEON_BUNDLE_DIGEST"
RECEIPT_DIR_ENV = "CACHEON_RECEIPT_DIR"

logger = logging.getLogger("cacheon.plugin")


def load() -> None:
    """The entry point SGLang calls."""
    arm_from_environment()


def arm_from_environment() -> Activation | None:
    """Arm ``$CACHEON_BUNDLE`` (no-op when unset or already armed here); on failure arm a refusal."""
    bundle = os.environ.get(BUNDLE_ENV, "").strip()
    if not bundle or active() is not None:
        return active()
    receipts = os.environ.get(RECEIPT_DIR_ENV, "").strip()
    expected = os.environ.get(DIGEST_ENV, "").strip() or None
    if expected is None:
        logger.warning("cacheon: $%s is not set: arming whatever %s holds now, not a verified digest", DIGEST_ENV,
                       bundle)
    try:
        activation = activate(
            bundle,
            expected_digest=expected,
            receipt_dir=Path(receipts) if receipts else None,
        )
    except Exception as exc:
        reason = f"cannot arm {bundle}: {type(exc).__name__}: {exc}"
        logger.error("cacheon: %s; this process will abort at its first process group", reason)
        try:
            return refuse(reason)
        except Exception as inner:  # no adapter for this SGLang at all: nothing can gate, so stop now
            raise SystemExit(f"cacheon: {reason}; and cannot arm a refusal: {inner}") from exc
    logger.info("cacheon: armed %s (%s) on %s", activation.bundle_id, activation.digest, ", ".join(activation.receipts))
    return activation
