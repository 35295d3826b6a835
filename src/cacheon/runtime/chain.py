"""The chain-SDK surface a Cacheon validator uses, checked separately from the engine so that a
Bittensor SDK change is never mistaken for an SGLang change (and vice versa).

Pinned to the classic SDK (see :mod:`cacheon.runtime.pin`): wallet, subtensor weight and commitment
calls, and the metagraph, with the parameter names a validator passes.
"""

from __future__ import annotations

import importlib.metadata as metadata
import platform
from typing import Any

from cacheon.runtime.canary import CanaryReport, run_canary
from cacheon.runtime.pin import BITTENSOR_DIST, BITTENSOR_PIN
from cacheon.runtime.surface import Surface

_SUBTENSOR = "bittensor.core.subtensor"

CHAIN_SURFACES: tuple[Surface, ...] = (
    Surface("wallet.Wallet", "bittensor_wallet", "Wallet", ("name", "hotkey", "path")),
    Surface("subtensor.Subtensor", _SUBTENSOR, "Subtensor", ("network", "config")),
    Surface("subtensor.get_current_block", _SUBTENSOR, "Subtensor.get_current_block"),
    Surface(
        "subtensor.get_uid_for_hotkey_on_subnet",
        _SUBTENSOR,
        "Subtensor.get_uid_for_hotkey_on_subnet",
        ("hotkey_ss58", "netuid", "block"),
    ),
    Surface(
        "subtensor.set_weights",
        _SUBTENSOR,
        "Subtensor.set_weights",
        ("wallet", "netuid", "uids", "weights", "version_key", "wait_for_inclusion", "wait_for_finalization"),
    ),
    Surface(
        "subtensor.commit_weights",
        _SUBTENSOR,
        "Subtensor.commit_weights",
        ("wallet", "netuid", "salt", "uids", "weights", "version_key"),
    ),
    Surface(
        "subtensor.reveal_weights",
        _SUBTENSOR,
        "Subtensor.reveal_weights",
        ("wallet", "netuid", "uids", "weights", "salt", "version_key"),
    ),
    Surface("subtensor.set_commitment", _SUBTENSOR, "Subtensor.set_commitment", ("wallet", "netuid", "data")),
    Surface("subtensor.get_commitment", _SUBTENSOR, "Subtensor.get_commitment", ("netuid", "uid", "block")),
    Surface("subtensor.get_all_commitments", _SUBTENSOR, "Subtensor.get_all_commitments", ("netuid", "block")),
    Surface("subtensor.metagraph", _SUBTENSOR, "Subtensor.metagraph", ("netuid", "lite", "block")),
    Surface(
        "metagraph.Metagraph",
        "bittensor.core.metagraph",
        "Metagraph",
        ("netuid", "network", "lite", "sync", "subtensor"),
    ),
    Surface("metagraph.Metagraph.sync", "bittensor.core.metagraph", "Metagraph.sync", ("block", "lite", "subtensor")),
)

# Distributions whose versions the chain record carries (the wallet and the substrate client are
# separate packages that change the surface on their own schedule).
CHAIN_PACKAGES = ("bittensor", "bittensor-wallet", "async-substrate-interface")


def run_chain_canary() -> CanaryReport:
    return run_canary(BITTENSOR_DIST, BITTENSOR_PIN, CHAIN_SURFACES)


def chain_environment() -> dict[str, Any]:
    """Versions the chain verdict depends on (from metadata; nothing imported)."""
    packages: dict[str, str | None] = {}
    for dist in CHAIN_PACKAGES:
        try:
            packages[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            packages[dist] = None
    return {"python": platform.python_version(), "packages": packages}
