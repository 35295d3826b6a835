"""``cacheon slots``: the registered slot catalog (the ABI kernel authors implement), and what the
SGLang pin offers each slot (armable, a call site the canary checks, or no call site at all)."""

from __future__ import annotations

import argparse
from typing import Any

from cacheon.commands._output import print_json
from cacheon.contract.catalog import ABI_VERSION, SLOTS, catalog_digest, describe_catalog
from cacheon.runtime.pin import SGLANG_PIN
from cacheon.runtime.seams import Standing, standing


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "slots",
        help="list the registered slots and their ABI",
        description="List every registered slot: kind, entry signature, tensors, comparator, shapes, and its "
        f"standing at the SGLang pin ({SGLANG_PIN}): armable, verifiable with its call site checked by "
        "`cacheon compat`, or verifiable only (the pin has no call site). The catalog digest changes whenever "
        "any part of the ABI changes; the standing is the pin's, outside the digest.",
    )
    p.add_argument("--json", action="store_true",
                   help="print the canonical catalog and its digest as JSON, and the pin's standing per slot")
    p.set_defaults(handler=run)


def _runtime(name: str) -> dict[str, Any]:
    state, seams, reason = standing(name)
    return {"standing": state.value, "armable": state is Standing.ARMABLE, "seams": [s.name for s in seams],
            "reason": reason}


def _standing_line(name: str) -> str:
    state, seams, reason = standing(name)
    if state is Standing.ARMABLE:
        return f"armable at sglang {SGLANG_PIN} ({', '.join(s.name for s in seams)})"
    if state is Standing.CHECKED_ONLY:
        sites = ", ".join(f"{s.module}:{s.chokepoint}" for s in seams)
        return f"verifiable; not armable at sglang {SGLANG_PIN}: call site {sites} is checked, no adapter arms it"
    return f"verifiable; not armable at sglang {SGLANG_PIN}: no call site ({reason})"


def run(args: argparse.Namespace) -> int:
    if args.json:
        runtime = {"sglang_pin": SGLANG_PIN, "slots": {name: _runtime(name) for name in sorted(SLOTS)}}
        print_json({"digest": catalog_digest(), **describe_catalog(), "runtime": runtime})
        return 0
    print(f"ABI {ABI_VERSION}   catalog {catalog_digest()}   {len(SLOTS)} slots")
    for name in sorted(SLOTS):
        slot = SLOTS[name]
        tensors = ", ".join(f"{t.name}({', '.join(t.shape)})" for t in slot.inputs)
        outputs = ", ".join(f"{t.name}({', '.join(t.shape)})" for t in slot.outputs)
        graph = "graph-proof required" if slot.requires_graph_proof() else "no graph proof"
        print(f"\n{slot.name}  [{slot.kind}]  {slot.signature()}")
        print(f"  {slot.summary}")
        print(f"  inputs: {tensors}   outputs (harness-allocated): {outputs}")
        print(f"  dtypes: {', '.join(slot.dtypes)}   compare: {slot.comparator.mode}   {graph}")
        print(f"  shapes: {'; '.join(s.label() for s in slot.shapes)}  (+ seeded {slot.token_dim} jitter)")
        print(f"  runtime: {_standing_line(name)}")
    return 0
