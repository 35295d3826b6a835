"""``cacheon identity``: the runtime identity this host binds evidence to."""

from __future__ import annotations

import argparse

from cacheon.commands._output import print_json
from cacheon.runtime.identity import describe, runtime_identity


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "identity",
        help="print this runtime's identity digest and the facts behind it",
        description="Capture SGLang, torch/CUDA, triton, flashinfer, sgl-kernel, Python, GPUs, the image "
        "digest ($CACHEON_IMAGE_DIGEST) and import stand-ins; print them and their digest.",
    )
    parser.add_argument("--json", action="store_true", help="print {digest, facts} as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    identity = runtime_identity()
    if args.json:
        print_json(identity.to_json())
    else:
        print("\n".join(describe(identity)))
    return 0
