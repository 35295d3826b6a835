"""Bundle signatures in the OpenSSF model-signing format, held to the model_signing package's own verifier.

On one shared set of good and tampered fixtures, `cacheon bundle verify-signature` must accept exactly
what model_signing's verifier accepts (its Python API and its `model_signing verify key` CLI, in its
default configuration), with one documented exception: Cacheon skips no path, where model_signing's
default skips .gitignore and friends.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from model_signing import hashing, signing, verifying

from cacheon.bundle.snapshot import read_snapshot
from cacheon.cli import main
from cacheon.evidence import keys, modelsign
from tests.conftest import REPO

SILU = REPO / "examples" / "bundles" / "silu-torch"
MODEL_SIGNING = Path(sys.executable).with_name("model_signing")


@dataclass(frozen=True)
class Case:
    bundle: Path
    signature: Path
    key: Path


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.bundle_keygen(tmp_path_factory.mktemp("keys") / "signer")


def _sign(bundle: Path, key: Path, out: Path) -> Path:
    out.write_bytes(modelsign.sign(read_snapshot(bundle), "silu-torch", key).data)
    return out


def _kernel(bundle: Path) -> Path:
    return next((bundle / "kernels").glob("*.py"))


def _good(root: Path, signer: tuple[Path, Path]) -> Case:
    bundle = root / "bundle"
    shutil.copytree(SILU, bundle)
    return Case(bundle, _sign(bundle, signer[0], root / "bundle.sig"), signer[1])


def _changed(case: Case, root: Path) -> Case:
    with _kernel(case.bundle).open("a") as fh:
        fh.write("# edited after signing\n")
    return case


def _added(case: Case, root: Path) -> Case:
    (case.bundle / "kernels" / "extra.py").write_text("x = 1\n")
    return case


def _removed(case: Case, root: Path) -> Case:
    _kernel(case.bundle).unlink()
    return case


def _renamed(case: Case, root: Path) -> Case:
    kernel = _kernel(case.bundle)
    kernel.rename(kernel.with_name("renamed.py"))
    return case


def _wrong_key(case: Case, root: Path) -> Case:
    _, other = keys.bundle_keygen(root / "other")
    return Case(case.bundle, case.signature, other)


def _other_bundle(case: Case, root: Path) -> Case:
    """The same signer's signature over another bundle (one kernel line differs)."""
    other = root / "other-bundle"
    shutil.copytree(case.bundle, other)
    _kernel(other).write_text(_kernel(other).read_text() + "\n# another bundle\n")
    return Case(case.bundle, _sign(other, case.key.with_name("signer.pem"), root / "other.sig"), case.key)


def _truncated(case: Case, root: Path) -> Case:
    data = case.signature.read_bytes()
    case.signature.write_bytes(data[: len(data) // 2])
    return case


def _garbage(case: Case, root: Path) -> Case:
    case.signature.write_bytes(b"\x00\xff not a signature \x1b[2K")
    return case


def _empty(case: Case, root: Path) -> Case:
    case.signature.write_bytes(b"")
    return case


def _flipped_payload(case: Case, root: Path) -> Case:
    """A signature whose statement was edited (one digest character changed) without re-signing."""
    import base64
    import json

    doc = json.loads(case.signature.read_bytes())
    payload = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    digest = payload["predicate"]["resources"][0]["digest"]
    payload["predicate"]["resources"][0]["digest"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    case.signature.write_text(json.dumps(doc))
    return case


def _directory(case: Case, root: Path) -> Case:
    case.signature.unlink()
    case.signature.mkdir()
    return case


def _fifo(case: Case, root: Path) -> Case:
    case.signature.unlink()
    os.mkfifo(case.signature)
    return case


def _symlinked_file(case: Case, root: Path) -> Case:
    """The signed kernel replaced by a link to the same bytes (an attack shape the issue did not name)."""
    kernel = _kernel(case.bundle)
    target = root / "outside.py"
    target.write_bytes(kernel.read_bytes())
    kernel.unlink()
    kernel.symlink_to(target)
    return case


def _hardlinked_file(case: Case, root: Path) -> Case:
    """The signed kernel, unchanged, given a second name outside the bundle (whoever owns it edits it later)."""
    os.link(_kernel(case.bundle), root / "outside-link.py")
    return case


def _gitignore(case: Case, root: Path) -> Case:
    (case.bundle / ".gitignore").write_text("*\n")
    return case


def _signed_by_model_signing(case: Case, root: Path) -> Case:
    """The same bundle signed by model_signing's own signer in its default configuration."""
    case.signature.unlink()
    signing.Config().use_elliptic_key_signer(private_key=case.key.with_name("signer.pem")).sign(case.bundle,
                                                                                                 case.signature)
    return case


def _signed_in(case: Case, hashing_config: hashing.Config) -> Case:
    case.signature.unlink()
    (signing.Config().set_hashing_config(hashing_config)
     .use_elliptic_key_signer(private_key=case.key.with_name("signer.pem")).sign(case.bundle, case.signature))
    return case


def _signed_by_model_signing_in_shards(case: Case, root: Path) -> Case:
    """model_signing's signer hashing 64-byte shards (its verifier reads shard_size back as a float)."""
    return _signed_in(case, hashing.Config().use_shard_serialization(shard_size=64))


def _signed_by_model_signing_with_blake2(case: Case, root: Path) -> Case:
    """model_signing 1.1.1 records blake2 as "blake2b", which its own verifier then does not know."""
    return _signed_in(case, hashing.Config().use_file_serialization(hashing_algorithm="blake2"))


def _signed_by_model_signing_then_gitignore(case: Case, root: Path) -> Case:
    return _gitignore(_signed_by_model_signing(case, root), root)


def _oversized(case: Case, root: Path) -> Case:
    with case.signature.open("ab") as fh:
        fh.write(b" " * (modelsign.MAX_SIGNATURE_BYTES + 1))
    return case


Tamper = Callable[[Case, Path], Case]
# (name, tamper, accepted by model_signing's default verifier, accepted by Cacheon)
FIXTURES: list[tuple[str, Tamper | None, bool, bool]] = [
    ("good", None, True, True),
    ("changed-file", _changed, False, False),
    ("added-file", _added, False, False),
    ("removed-file", _removed, False, False),
    ("renamed-file", _renamed, False, False),
    ("wrong-key", _wrong_key, False, False),
    ("another-bundles-signature", _other_bundle, False, False),
    ("truncated-signature", _truncated, False, False),
    ("garbage-signature", _garbage, False, False),
    ("empty-signature", _empty, False, False),
    ("edited-statement", _flipped_payload, False, False),
    ("directory-as-signature", _directory, False, False),
    ("fifo-as-signature", _fifo, False, False),  # model_signing's own reader hangs on it: never accepts
    ("symlinked-file", _symlinked_file, False, False),
    # the documented exceptions: Cacheon reads a bundle only as its snapshot does (one link per file) ...
    ("hardlinked-file", _hardlinked_file, True, False),
    # ... and skips nothing, where model_signing's default skips .gitignore
    ("added-gitignore", _gitignore, True, False),
    # model_signing's own signature is accepted; its default records .git* as skipped, which Cacheon does not honour
    ("signed-by-model-signing", _signed_by_model_signing, True, True),
    ("signed-by-model-signing-then-gitignore", _signed_by_model_signing_then_gitignore, True, False),
    # model_signing 1.1.1's verifier cannot read back its own shard or blake2 signatures; neither accepts them
    ("signed-by-model-signing-in-shards", _signed_by_model_signing_in_shards, False, False),
    ("signed-by-model-signing-with-blake2", _signed_by_model_signing_with_blake2, False, False),
    ("oversized-signature", _oversized, True, False),  # trailing spaces are valid JSON; Cacheon reads 4 MiB at most
]


def _case(tmp_path: Path, signer: tuple[Path, Path], tamper: Tamper | None) -> Case:
    case = _good(tmp_path, signer)
    return tamper(case, tmp_path) if tamper else case


def _library_accepts(case: Case) -> bool:
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=case.key).verify(case.bundle, case.signature)
    except Exception:
        return False
    return True


def _cacheon_accepts(case: Case) -> bool:
    return modelsign.verify(read_snapshot(case.bundle), case.signature, case.key).ok


@pytest.mark.parametrize(("name", "tamper", "theirs", "ours"), FIXTURES, ids=[f[0] for f in FIXTURES])
def test_cacheon_and_model_signings_api_agree(tmp_path, signer, name, tamper, theirs, ours):
    case = _case(tmp_path, signer, tamper)
    assert _cacheon_accepts(case) is ours
    if name == "fifo-as-signature":
        return  # the library's reader would block on it forever (the CLI test shows it never accepts)
    assert _library_accepts(case) is theirs


@pytest.mark.slow
def test_cacheon_and_model_signings_cli_agree(tmp_path, signer, capsys):
    """Every fixture through both command lines, as a user runs them (exit 0 means accepted): model_signing's
    in its own process, a few at a time; cacheon's through its entry function."""
    cases = []
    for name, tamper, theirs, ours in FIXTURES:
        (tmp_path / name).mkdir()
        cases.append((name, theirs, ours, _case(tmp_path / name, signer, tamper)))
    their_codes: dict[str, int | None] = {}
    for start in range(0, len(cases), 4):
        batch = [(name, subprocess.Popen([str(MODEL_SIGNING), "verify", "key", str(case.bundle), "--signature",
                                          str(case.signature), "--public_key", str(case.key)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                 for name, _, _, case in cases[start:start + 4]]
        for name, proc in batch:
            try:
                their_codes[name] = proc.wait(timeout=5 if name == "fifo-as-signature" else 120)
            except subprocess.TimeoutExpired:  # model_signing's reader blocks on the FIFO: never accepts
                proc.kill()
                their_codes[name] = proc.wait()
    for name, theirs, ours, case in cases:
        assert (their_codes[name] == 0) is theirs, name
        code, out, err = run(capsys, "bundle", "verify-signature", case.bundle, "--signature", case.signature,
                             "--key", case.key)
        assert (code, err) == (0 if ours else 2, ""), (name, out, err)
        assert len(out.strip().splitlines()) == 1 and out.startswith("OK bundle" if ours else "FAIL bundle"), out


# --- signing: exactly the snapshot, and what it refuses -----------------------------------------------------

def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main([str(word) for word in argv])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_signed_archive_verifies_as_its_directory(tmp_path, signer, capsys):
    """`package` then `bundle sign` of the archive; the signature verifies over the directory (what a user
    verifying with model_signing extracts) and over the archive itself."""
    archive, sig = tmp_path / "silu.tar.gz", tmp_path / "silu.sig"
    assert run(capsys, "package", SILU, "--out", archive)[0] == 0
    code, out, err = run(capsys, "bundle", "sign", archive, "--key", signer[0], "--out", sig, "--json")
    assert code == 0, err
    assert '"format": "model-signing"' in out
    for target in (archive, SILU):
        code, out, err = run(capsys, "bundle", "verify-signature", target, "--signature", sig, "--key", signer[1])
        assert (code, err) == (0, ""), err
        assert out.startswith("OK bundle sha256:")
    assert _library_accepts(Case(SILU, sig, signer[1]))


def test_the_signature_covers_the_snapshot_not_a_second_read(tmp_path, signer, monkeypatch):
    """What is signed is what was read once: a change to the directory after the read is not in it."""
    bundle = _good(tmp_path, signer).bundle
    snapshot = read_snapshot(bundle)
    with _kernel(bundle).open("a") as fh:
        fh.write("# written after the read\n")
    sig = tmp_path / "snap.sig"
    sig.write_bytes(modelsign.sign(snapshot, "silu-torch", signer[0]).data)
    assert modelsign.verify(snapshot, sig, signer[1]).ok
    assert not _library_accepts(Case(bundle, sig, signer[1]))  # the directory now differs from what was signed


def test_a_signature_is_checked_against_the_key_that_was_checked(tmp_path, signer, monkeypatch):
    """The library reads the key file itself: a file other than the one Cacheon checked is caught."""
    _, other_public = keys.bundle_keygen(tmp_path / "other")
    other = keys.load_bundle_private_key(other_public.with_name("other.pem"))
    monkeypatch.setattr(keys, "load_bundle_private_key", lambda path: other)
    with pytest.raises(modelsign.UsageError, match="changed while signing; nothing written"):
        modelsign.sign(read_snapshot(SILU), "silu-torch", signer[0])


def test_a_cacheon_signature_lists_every_file_and_skips_nothing(tmp_path, signer):
    """No `ignore_paths` in the signed statement: a verifier honouring them (model_signing does) skips nothing."""
    import base64
    import json

    sig = _good(tmp_path, signer).signature
    statement = json.loads(base64.b64decode(json.loads(sig.read_bytes())["dsseEnvelope"]["payload"]))
    assert statement["predicate"]["serialization"] == {"method": "files", "hash_type": "sha256",
                                                       "allow_symlinks": False}
    assert {r["name"] for r in statement["predicate"]["resources"]} == set(read_snapshot(SILU).files)
    assert statement["subject"][0]["name"] == "silu-torch"


def test_a_refused_entry_is_named(tmp_path, signer):
    case = _symlinked_file(_good(tmp_path, signer), tmp_path)
    problem = modelsign.verify(read_snapshot(case.bundle), case.signature, case.key).problem
    assert problem is not None and "refused (symlink" in problem


def test_a_bundle_that_fails_scan_is_not_signed(tmp_path, signer, capsys):
    bundle = tmp_path / "b"
    shutil.copytree(SILU, bundle)
    (bundle / "kernels" / "extra.py").write_text("x = 1\n")
    code, _, err = run(capsys, "bundle", "sign", bundle, "--key", signer[0], "--out", tmp_path / "b.sig")
    assert code == 2 and "undeclared-file" in err and "nothing signed" in err
    assert not (tmp_path / "b.sig").exists()


def test_a_path_the_format_skips_is_refused_at_signing(tmp_path, signer):
    bundle = tmp_path / "b"
    shutil.copytree(SILU, bundle)
    (bundle / ".gitattributes").write_text("* text\n")
    with pytest.raises(modelsign.UsageError, match="skipped by model-signing's default verifier"):
        modelsign.sign(read_snapshot(bundle), "silu-torch", signer[0])


def test_an_existing_signature_is_kept_unless_force(tmp_path, signer, capsys):
    sig = tmp_path / "b.sig"
    sig.write_text("keep")
    code, _, err = run(capsys, "bundle", "sign", SILU, "--key", signer[0], "--out", sig)
    assert code == 1 and err.strip() == f"cacheon bundle: error: --out {sig} exists; add --force to replace it"
    assert sig.read_text() == "keep"
    assert run(capsys, "bundle", "sign", SILU, "--key", signer[0], "--out", sig, "--force")[0] == 0
    assert _library_accepts(Case(SILU, sig, signer[1]))


# --- keys ---------------------------------------------------------------------------------------------------

def test_keygen_writes_a_0600_p256_pair_and_never_overwrites(tmp_path, capsys):
    code, out, _ = run(capsys, "bundle", "keygen", tmp_path / "k" / "me", "--json")
    assert code == 0 and '"key_id"' in out
    private, public = tmp_path / "k" / "me.pem", tmp_path / "k" / "me.pub.pem"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and stat.S_IMODE(public.stat().st_mode) == 0o644
    before = private.read_bytes()
    code, _, err = run(capsys, "bundle", "keygen", tmp_path / "k" / "me")
    assert code == 1 and "exists; refusing to overwrite a key" in err
    assert private.read_bytes() == before
    (tmp_path / "k" / "dangling.pem").symlink_to(tmp_path / "nowhere")
    code, _, err = run(capsys, "bundle", "keygen", tmp_path / "k" / "dangling")
    assert code == 1 and "refusing to overwrite" in err and not (tmp_path / "nowhere").exists()


def _ed25519_pem(path: Path) -> Path:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    return path


@pytest.mark.parametrize("shape", ["readable-by-others", "ed25519", "public-half", "fifo", "directory", "garbage"])
def test_an_unusable_signing_key_is_one_line(tmp_path, signer, capsys, shape):
    key = tmp_path / "key.pem"
    if shape == "readable-by-others":
        key.write_bytes(signer[0].read_bytes())
        key.chmod(0o644)
    elif shape == "ed25519":
        _ed25519_pem(key)
    elif shape == "public-half":
        key.write_bytes(signer[1].read_bytes())
        key.chmod(0o600)
    elif shape == "fifo":
        os.mkfifo(key, 0o600)
    elif shape == "directory":
        key.mkdir(0o700)
    else:
        key.write_bytes(b"-----BEGIN PRIVATE KEY-----\n\x1b[2Kjunk\n")
        key.chmod(0o600)
    code, out, err = run(capsys, "bundle", "sign", SILU, "--key", key, "--out", tmp_path / "b.sig")
    assert code == 1 and out == "", err
    assert len(err.strip().splitlines()) == 1 and err.startswith("cacheon bundle: error: ") and "\x1b" not in err
    assert not (tmp_path / "b.sig").exists()


@pytest.mark.parametrize("shape", ["private-half", "ed25519", "fifo", "missing"])
def test_an_unusable_public_key_is_one_line(tmp_path, signer, capsys, shape):
    case = _good(tmp_path, signer)
    key = tmp_path / "pub.pem"
    if shape == "private-half":
        key.write_bytes(signer[0].read_bytes())
    elif shape == "ed25519":
        _ed25519_pem(tmp_path / "ed.pem")
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_private_key

        private = load_pem_private_key((tmp_path / "ed.pem").read_bytes(), None)
        key.write_bytes(private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    elif shape == "fifo":
        os.mkfifo(key)
    code, out, err = run(capsys, "bundle", "verify-signature", case.bundle, "--signature", case.signature, "--key", key)
    assert code == 1 and out == "", err
    assert len(err.strip().splitlines()) == 1 and err.startswith("cacheon bundle: error: ")


def test_without_the_signing_extra_the_command_says_what_to_install(tmp_path, signer, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "model_signing" or m.startswith("model_signing.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "model_signing", None)  # import model_signing now raises ImportError
    code, _, err = run(capsys, "bundle", "sign", SILU, "--key", signer[0], "--out", tmp_path / "b.sig")
    assert code == 1
    assert err.strip() == f"cacheon bundle: error: {modelsign.INSTALL_HINT}"
