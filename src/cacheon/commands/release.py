"""``cacheon release keygen|sbom|build|sign|verify``: Engine releases as signed in-toto attestations."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cacheon.commands._args import positive_int
from cacheon.commands._files import existing_parent, written_whole
from cacheon.commands._output import add_subcommands, print_json, print_keys
from cacheon.errors import UsageError
from cacheon.evidence import keys, legacy, release, sbom
from cacheon.evidence.classes import EvidenceClass, release_subject
from cacheon.evidence.record import add_record_arguments, record_from_cli
from cacheon.printable import escape_controls


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("release", help="build, sign and verify Engine releases (signed attestations)")
    actions = add_subcommands(parser, "action", "ACTION")

    keygen = actions.add_parser("keygen", help="write an Ed25519 key pair: PREFIX.key (0600) and PREFIX.pub")
    keygen.add_argument("prefix", type=Path, metavar="PREFIX",
                        help="path without suffix: PREFIX.key and PREFIX.pub are written (neither may exist; "
                        "a missing key directory is created)")
    keygen.set_defaults(handler=run_keygen)

    bom = actions.add_parser(
        "sbom",
        help="write a CycloneDX SBOM of this Python environment (run it inside the engine image)",
        description="One library component per installed distribution (importlib.metadata), CycloneDX 1.6 "
        "JSON. A release spec names it with `sbom = PATH`; build and verify check it against the identity.",
    )
    bom.add_argument("--out", required=True, type=Path, metavar="FILE", help="the SBOM file to write (must not exist)")
    bom.set_defaults(handler=run_sbom)

    build = actions.add_parser("build", help="build an unsigned release directory from a release.toml spec")
    build.add_argument("--spec", required=True, type=Path, help="the release.toml spec: artifacts, SBOM, identity")
    build.add_argument("--out", required=True, type=Path, metavar="DIR",
                       help="the release directory to create (absent or empty; its parent must exist)")
    build.set_defaults(handler=run_build)

    sign = actions.add_parser("sign", help="add this key's signature to a release (each key signs once)")
    sign.add_argument("release_dir", type=Path, metavar="DIR", help="a release directory from `release build`")
    sign.add_argument("--key", required=True, type=Path, help="private key file from `release keygen`")
    sign.set_defaults(handler=run_sign)

    verify = actions.add_parser(
        "verify",
        help="check the attestation, every artifact byte and the signatures (exit 2 on any difference)",
        description="Requires signatures by at least --threshold distinct keys among those given with --key "
        "(a key counts once however often it signed; signatures by other keys are ignored). A signature "
        "check is recorded (with --record) as release_signature evidence: it says the release is intact and "
        "signed, not that it serves.",
    )
    verify.add_argument("release_dir", type=Path, metavar="DIR", help="the release directory to check")
    verify.add_argument(
        "--key",
        "--public-key",
        dest="keys",
        action="append",
        required=True,
        metavar="PUB",
        help="a trusted signer's public key, obtained out of band: 64 hex or a .pub file (repeatable)",
    )
    verify.add_argument("--threshold", type=positive_int, default=1, metavar="N",
                        help="distinct trusted signers required")
    verify.add_argument(
        "--legacy",
        action="store_true",
        help="verify a release in the format before attestations (descriptor.json + signature.json; one key)",
    )
    add_record_arguments(verify)
    verify.set_defaults(handler=run_verify)

    for action in (keygen, bom, build, sign, verify):
        action.add_argument("--json", action="store_true", help="machine-readable output")


def run_keygen(args: argparse.Namespace) -> int:
    private_path, public_path = keys.keygen(args.prefix)
    print_keys(private_path, public_path, public_path.read_text().strip(), as_json=args.json)
    return 0


def run_sbom(args: argparse.Namespace) -> int:
    if args.out.exists():
        raise UsageError(f"{args.out} exists; refusing to overwrite an SBOM")
    existing_parent(args.out)
    data = sbom.environment_sbom()
    with written_whole(args.out) as temporary:
        temporary.write_bytes(data)
    components = len(sbom.read(args.out))
    if args.json:
        print_json({"sbom": str(args.out), "components": components, "media_type": sbom.MEDIA_TYPE})
    else:
        print(f"wrote {args.out}: CycloneDX 1.6, {components} Python distributions")
    return 0


def run_build(args: argparse.Namespace) -> int:
    existing_parent(args.out)
    built = release.build(args.spec, args.out)
    if args.json:
        print_json(
            {
                "release": str(built.release_dir),
                "digest": built.digest,
                "statement_digest": built.statement_digest,
                "subjects": built.subjects,
                "signatures": 0,
            }
        )
    else:
        print(f"built release {built.digest} in {args.out} (unsigned: run `cacheon release sign {args.out} --key KEY`)")
    return 0


def run_sign(args: argparse.Namespace) -> int:
    result = release.sign(args.release_dir, args.key)
    if args.json:
        print_json({**result.to_json(), "signed_by": result.signers})
    else:
        count = len(result.signatures)
        print(f"signed release {result.release_digest} ({count} signature{'s' if count != 1 else ''} now)")  # ours
    return 0


def run_verify(args: argparse.Namespace) -> int:
    trusted = [keys.parse_public_key(k) for k in args.keys]
    if args.legacy:
        if len(trusted) != 1 or args.threshold != 1:
            raise UsageError("--legacy releases carry one signature: give exactly one --key and no --threshold")
        result = legacy.verify(args.release_dir, trusted[0])
    else:
        result = release.verify(args.release_dir, trusted, threshold=args.threshold)
    code = 0 if result.ok else 2
    if args.json:
        print_json(result.to_json())
    elif result.ok:
        print(escape_controls(_ok_line(result.to_json())))
    else:  # every value in a problem may come from the release: escaped, so none can redraw the report
        print(f"FAIL release {escape_controls(str(args.release_dir))}:")
        for problem in result.problems:
            print(f"  - {escape_controls(problem)}")
    record_from_cli(
        args,
        evidence_class=EvidenceClass.RELEASE_SIGNATURE,
        subject=release_subject(result.release_digest or "unreadable"),
        exit_code=code,
        details=result.to_json(),
    )
    return code


def _ok_line(report: dict[str, Any]) -> str:
    if report["format"] == "legacy":
        return f"OK release {report['digest']} (legacy format): descriptor, signature and every artifact verified"
    signers = len(report["trusted_signers"])
    return (
        f"OK release {report['digest']}: attestation, SBOM and every artifact verified; "
        f"{signers} trusted signer{'s' if signers != 1 else ''} (threshold {report['threshold']})"
    )
