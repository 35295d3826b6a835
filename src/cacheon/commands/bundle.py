"""``cacheon bundle keygen|sign|verify-signature``: bundle signatures in the OpenSSF model-signing format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cacheon.bundle.admission import admit
from cacheon.bundle.archive import open_bundle
from cacheon.bundle.snapshot import read_snapshot
from cacheon.commands._files import new_path, written_whole
from cacheon.commands._output import add_subcommands, print_json, print_keys
from cacheon.evidence import keys, modelsign
from cacheon.printable import escape_controls

_FORMAT = ("The signature is an OpenSSF model-signing file (a Sigstore bundle, key method), which its own tool "
           "verifies over the extracted bundle directory: `model_signing verify key DIR --signature SIG "
           "--public_key PUB.pem`. Needs the signing extra: pip install 'cacheon[signing]'.")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bundle", help="sign bundles so anyone can verify them (OpenSSF model-signing format)",
                            description=_FORMAT)
    actions = add_subcommands(parser, "action", "ACTION")

    keygen = actions.add_parser(
        "keygen", help="write an EC P-256 key pair for bundle signatures: PREFIX.pem (0600) and PREFIX.pub.pem",
        description="The model-signing format's key method verifies NIST P-256 keys (release keys stay Ed25519: "
        "`cacheon release keygen`). Give PREFIX.pub.pem to whoever verifies, out of band.",
    )
    keygen.add_argument("prefix", type=Path, metavar="PREFIX",
                        help="path without suffix: PREFIX.pem and PREFIX.pub.pem are written (neither may exist; "
                        "a missing key directory is created)")
    keygen.set_defaults(handler=run_keygen)

    sign = actions.add_parser(
        "sign", help="sign a bundle that passes scan: exactly the bytes scanned",
        description="Scan BUNDLE (a directory or .tar.gz) and sign the snapshot scanned, never a second read of "
        "it. A bundle with scan violations is not signed (exit 2, the findings on stderr). " + _FORMAT,
    )
    sign.add_argument("bundle", type=Path, help="bundle directory or .tar.gz archive")
    sign.add_argument("--key", required=True, type=Path, help="P-256 private key (PEM) from `cacheon bundle keygen`")
    sign.add_argument("--out", required=True, type=Path, metavar="SIG",
                      help="signature file to write (e.g. bundle.sig); its directory must exist")
    sign.add_argument("--force", action="store_true", help="replace an existing signature at --out")
    sign.set_defaults(handler=run_sign)

    check = actions.add_parser(
        "verify-signature", help="check a model-signing signature over a bundle (exit 2 on any difference)",
        description="Exit 0 when SIG is the key's signature over exactly the files of BUNDLE (a directory or "
        ".tar.gz): none changed, added or removed, no link or special file. Cacheon accepts what model_signing's "
        "own verifier accepts, except that nothing is skipped (it skips .git, .github, .gitignore and "
        ".gitattributes by default; Cacheon counts them) and the bundle is read as scan reads it (a file with a "
        "second hard link, or over 1 MiB, is refused). Exit 2 on any difference or an unreadable signature, "
        "1 for an unusable key or bundle.",
    )
    check.add_argument("bundle", type=Path, help="bundle directory or .tar.gz archive")
    check.add_argument("--signature", required=True, type=Path, metavar="SIG", help="the signature file to check")
    check.add_argument("--key", "--public-key", dest="key", required=True, type=Path, metavar="PUB",
                       help="the signer's P-256 public key (PEM), obtained out of band")
    check.set_defaults(handler=run_verify)

    for action in (keygen, sign, check):
        action.add_argument("--json", action="store_true", help="machine-readable output")


def run_keygen(args: argparse.Namespace) -> int:
    private_path, public_path = keys.bundle_keygen(args.prefix)
    key_id = keys.bundle_key_id(keys.load_bundle_public_key(public_path))
    print_keys(private_path, public_path, key_id, as_json=args.json)
    return 0


def run_sign(args: argparse.Namespace) -> int:
    out = new_path(args.out, force=args.force)
    with open_bundle(args.bundle) as root:
        admission = admit(root)
    admission.require_usable_manifest(args.bundle)
    bundle_id = admission.manifest.bundle_id
    if not admission.admitted:
        for finding in admission.scan.findings:
            print(finding, file=sys.stderr)
        print(f"cacheon bundle sign: {bundle_id}: scan found {len(admission.scan.findings)} violation(s); "
              "nothing signed", file=sys.stderr)
        return 2
    signed = modelsign.sign(admission.snapshot, bundle_id, args.key)
    with written_whole(out) as temporary:
        temporary.write_bytes(signed.data)
    key_id = signed.key_id
    if args.json:
        print_json({"signature": str(out), "bundle_id": bundle_id, "bundle_digest": admission.digest,
                    "files": len(admission.snapshot.files), "key_id": key_id, "format": "model-signing"})
    else:
        print(f"signed {bundle_id} {admission.digest} ({len(admission.snapshot.files)} files) by key {key_id}: {out}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    with open_bundle(args.bundle) as root:
        snapshot = read_snapshot(root)
    verdict = modelsign.verify(snapshot, args.signature, args.key)
    if args.json:
        print_json({"bundle": str(args.bundle), "signature": str(args.signature), **verdict.to_json()})
    elif verdict.ok:
        print(f"OK bundle {verdict.bundle_digest}: {verdict.files} files signed by key {verdict.key_id}")
    else:
        print(f"FAIL bundle {escape_controls(str(args.bundle))}: {verdict.problem}")
    return 0 if verdict.ok else 2
