"""``cacheon chain-compat``: the static Bittensor SDK canary, kept apart from the engine's."""

from __future__ import annotations

import argparse

from cacheon.commands.compat import emit_canary
from cacheon.evidence.classes import CHAIN_COMPAT_SUBJECT
from cacheon.evidence.record import add_record_arguments
from cacheon.runtime.chain import chain_environment, run_chain_canary
from cacheon.runtime.pin import BITTENSOR_PIN


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
    return emit_canary(args, run_chain_canary, chain_environment, CHAIN_COMPAT_SUBJECT)
