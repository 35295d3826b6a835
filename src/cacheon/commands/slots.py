"""``cacheon slots``: the registered slot catalog (the ABI kernel authors implement)."""

from __future__ import annotations

import argparse

from cacheon.commands._output import print_json
from cacheon.contract.catalog import ABI_VERSION, SLOTS, catalog_digest, describe_catalog


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "slots",
        help="list the registered slots and their ABI",
        description="List every registered slot: kind, entry signature, tensors, comparator, shapes. "
        "The catalog digest changes whenever any part of the ABI changes.",
    )
    p.add_argument("--json", action="store_true", help="print the canonical catalog and its digest as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.json:
        print_json({"digest": catalog_digest(), **describe_catalog()})
        return 0
    print(f"ABI {ABI_VERSION}   catalog {catalog_digest()}")
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
    return 0
