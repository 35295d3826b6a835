"""``cacheon chain-compat``: the static Bittensor SDK canary, kept apart from the engine's."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import cacheon
from cacheon.commands.compat import emit_canary
from cacheon.evidence.classes import CHAIN_COMPAT_SUBJECT
from cacheon.evidence.record import add_record_arguments
from cacheon.runtime.chain import chain_environment, run_chain_canary
from cacheon.runtime.pin import BITTENSOR_PIN

TARGET_ENV = "CACHEON_CHAIN_TARGET"  # where scripts/install_chain_pin.sh put the SDK (its CHAIN_TARGET)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "chain-compat",
        help="check the installed Bittensor SDK against its pin and the validator surface",
        description=f"Import the installed bittensor SDK, compare its version with the pin {BITTENSOR_PIN} "
        "and check the wallet, subtensor weight/commitment calls and metagraph a validator uses. "
        "Exit 0 only for the exact pin with no FAIL; 2 otherwise.",
    )
    parser.add_argument("--json", action="store_true", help="print the whole table and the SDK versions")
    add_record_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    _find_sdk()
    return emit_canary(args, run_chain_canary, chain_environment, CHAIN_COMPAT_SUBJECT)


def _find_sdk() -> None:
    """The pinned SDK lives apart from the venv (scripts/install_chain_pin.sh): when it is not importable,
    look where that script puts it (``$CACHEON_CHAIN_TARGET``, else ``.chain/bittensor`` in the current
    directory or in the checkout Cacheon runs from) and import it from there; else say what to set."""
    if importlib.util.find_spec("bittensor") is not None:
        return
    checkout = Path(cacheon.__file__).resolve().parents[2]
    places = [Path(os.environ[TARGET_ENV])] if os.environ.get(TARGET_ENV) else [
        Path.cwd() / ".chain" / "bittensor", checkout / ".chain" / "bittensor"]
    found = next((p for p in places if (p / "bittensor").is_dir()), None)
    if found is not None:
        sys.path.insert(0, str(found))
        print(f"chain-compat: the Bittensor SDK from {found}", file=sys.stderr)
        return
    print(f"chain-compat: bittensor is not importable and not in {' or '.join(map(str, places))}: run "
          f"scripts/install_chain_pin.sh (make setup does), or set {TARGET_ENV} (or PYTHONPATH) to the directory "
          "it installed into", file=sys.stderr)
