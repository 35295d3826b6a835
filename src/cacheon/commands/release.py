"""``cacheon release keygen|build|sign|verify``: signed Engine release descriptors."""

from __future__ import annotations

import argparse
from pathlib import Path

from cacheon.commands._output import add_subcommands, print_json
from cacheon.evidence import keys, release
from cacheon.evidence.classes import EvidenceClass, release_subject
from cacheon.evidence.record import add_record_arguments, record_from_cli


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("release", help="build, sign and verify Engine release descriptors")
    actions = add_subcommands(parser, "action", "ACTION")

    keygen = actions.add_parser("keygen", help="write an Ed25519 key pair: PREFIX.key (0600) and PREFIX.pub")
    keygen.add_argument("prefix", type=Path, metavar="PREFIX")
    keygen.set_defaults(handler=run_keygen)

    build = actions.add_parser("build", help="build a release directory from a release.toml spec")
    build.add_argument("--spec", required=True, type=Path)
    build.add_argument("--out", required=True, type=Path, metavar="DIR")
    build.set_defaults(handler=run_build)

    sign = actions.add_parser("sign", help="sign a built release (once)")
    sign.add_argument("release_dir", type=Path, metavar="DIR")
    sign.add_argument("--key", required=True, type=Path, help="private key file from `release keygen`")
    sign.set_defaults(handler=run_sign)

    verify = actions.add_parser(
        "verify",
        help="check descriptor digest, signature and every artifact byte (exit 2 on any difference)",
        description="A signature check is recorded (with --record) as release_signature evidence: it says "
        "the release is intact and signed, not that it serves.",
    )
    verify.add_argument("release_dir", type=Path, metavar="DIR")
    verify.add_argument(
        "--public-key", required=True, metavar="HEX", help="the signer's key, obtained out of band"
    )
    verify.add_argument("--json", action="store_true")
    add_record_arguments(verify)
    verify.set_defaults(handler=run_verify)


def run_keygen(args: argparse.Namespace) -> int:
    private_path, public_path = keys.keygen(args.prefix)
    print(f"private key {private_path} (mode 600; keep it secret)")
    print(f"public key  {public_path}: {public_path.read_text().strip()}")
    return 0


def run_build(args: argparse.Namespace) -> int:
    digest = release.build(args.spec, args.out)
    print(f"built release {digest} in {args.out} (unsigned: run `cacheon release sign {args.out} --key KEY`)")
    return 0


def run_sign(args: argparse.Namespace) -> int:
    digest = release.sign(args.release_dir, args.key)
    print(f"signed release {digest}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    result = release.verify(args.release_dir, args.public_key)
    code = 0 if result.ok else 2
    if args.json:
        print_json(result.to_json())
    elif result.ok:
        print(f"OK release {result.release_digest}: descriptor, signature and every artifact verified")
    else:
        print(f"FAIL release {args.release_dir}:")
        for problem in result.problems:
            print(f"  - {problem}")
    subject = release_subject(result.release_digest or "unreadable")
    record_from_cli(
        args,
        evidence_class=EvidenceClass.RELEASE_SIGNATURE,
        subject=subject,
        exit_code=code,
        details=result.to_json(),
    )
    return code
