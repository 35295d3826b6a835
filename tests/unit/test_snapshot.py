"""The bundle snapshot: one read through directory descriptors, regular files only, bounded; and
the private copy written from its bytes, not from the path."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cacheon.bundle import snapshot as snap_mod
from cacheon.bundle.admission import admit
from cacheon.bundle.loader import load_entry
from cacheon.bundle.manifest import load_manifest
from cacheon.bundle.snapshot import Snapshot, SnapshotLimits, materialise, read_snapshot
from cacheon.errors import UsageError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "bundles"
KERNEL = "kernels/silu_and_mul.py"


def silu(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(EXAMPLES / "silu-torch", root)
    return root


def old_digest(root: Path) -> str:
    """The digest as bundle/digest.py computed it before snapshots (rglob order, read by path)."""
    h = hashlib.sha256(b"cacheon.bundle.v1\x00")
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            continue
        name, data = path.relative_to(root).as_posix().encode(), path.read_bytes()
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return "sha256:" + h.hexdigest()


def rules(snapshot: Snapshot) -> dict[str, str]:
    return {rel: rule for rel, rule, _ in snapshot.refused}


def test_the_digest_format_is_unchanged(tmp_path):
    root = silu(tmp_path)
    for rel in ("a-b.py", "a/b.py", "a.py", "kernels/z/y.py", "kernels-x.py"):  # '-' sorts before '/'
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    assert read_snapshot(root).digest == old_digest(root)
    for name in os.listdir(EXAMPLES):
        assert read_snapshot(EXAMPLES / name).digest == old_digest(EXAMPLES / name), name


def test_a_symlinked_directory_is_refused_and_nothing_behind_it_is_read(tmp_path):
    root = silu(tmp_path)
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.py").write_text("TOKEN = 'host secret'\n")
    (root / "kernels" / "linked").symlink_to(host, target_is_directory=True)
    snapshot = read_snapshot(root)
    assert rules(snapshot) == {"kernels/linked": "symlink"} and snapshot.digest is None
    assert not any(b"host secret" in data for data in snapshot.files.values())
    assert not admit(root).admitted


def test_a_manifest_path_through_a_symlinked_directory_is_a_manifest_error(tmp_path):
    root = silu(tmp_path)
    (root / "real").mkdir()
    (root / "real" / "k.py").write_text((root / KERNEL).read_text())
    (root / "via").symlink_to(root / "real", target_is_directory=True)
    (root / "manifest.toml").write_text((root / "manifest.toml").read_text().replace(KERNEL, "via/k.py"))
    with pytest.raises(UsageError, match=r"via/k\.py goes through a symlink \(via\)"):
        load_manifest(root)


def test_a_symlinked_root_is_refused(tmp_path):
    root = silu(tmp_path)
    (tmp_path / "link").symlink_to(root, target_is_directory=True)
    with pytest.raises(UsageError, match="is a symlink; name the bundle directory itself"):
        read_snapshot(tmp_path / "link")
    (tmp_path / "above").symlink_to(tmp_path, target_is_directory=True)  # a link above the root is the user's
    assert read_snapshot(tmp_path / "above" / "bundle").digest == read_snapshot(root).digest


def test_hard_links_fifos_and_sparse_giants_are_refused_without_reading(tmp_path):
    root = silu(tmp_path)
    (tmp_path / "host.txt").write_text("host secret\n")
    os.link(tmp_path / "host.txt", root / "README.md")  # a host file under an allowed name
    os.mkfifo(root / "kernels" / "pipe.py")  # a naive open() would block here forever
    with open(root / "huge.txt", "wb") as fh:
        fh.truncate(64 << 30)  # 64 GiB, sparse: reading it would take the host's memory
    snapshot = read_snapshot(root)
    assert rules(snapshot) == {"README.md": "hardlink", "kernels/pipe.py": "special-file",
                               "huge.txt": "oversized-file"}
    assert set(snapshot.files) == {"manifest.toml", KERNEL} and snapshot.digest is None
    found = {(f.file, f.rule) for f in admit(root).scan.findings}
    assert {("kernels/pipe.py", "special-file"), ("huge.txt", "oversized-file"), ("README.md", "hardlink")} <= found


def test_names_that_are_not_text_are_refused(tmp_path):
    root = silu(tmp_path)
    os.mkdir(os.path.join(os.fsencode(root), b"bad\xff"))
    (root / "tab\there.py").write_text("x = 1\n")
    assert set(rules(read_snapshot(root)).values()) == {"bad-filename"}


@pytest.mark.parametrize(("limits", "message"), [
    (SnapshotLimits(max_entries=3), "more than 3 entries"),
    (SnapshotLimits(max_total_bytes=100), "more than 100 bytes"),
    (SnapshotLimits(max_depth=1), "nested deeper than 1"),
])
def test_the_tree_is_bounded(tmp_path, limits, message):
    root = silu(tmp_path)
    (root / "a" / "b").mkdir(parents=True)
    with pytest.raises(UsageError, match=message):
        read_snapshot(root, limits)


def test_not_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "absent"):
        with pytest.raises(UsageError, match="is not a bundle directory"):
            read_snapshot(path)


def swap_after_listing(monkeypatch, name: str, swap) -> None:
    """Run ``swap`` right after the walk has stat'ed ``name``: the window a path-based reader loses."""
    real = snap_mod._lstat

    def lstat(fd, entry, walk, rel):
        listed = real(fd, entry, walk, rel)
        if entry == name:
            swap()
        return listed

    monkeypatch.setattr(snap_mod, "_lstat", lstat)


def test_a_directory_swapped_for_a_symlink_mid_walk_is_refused(tmp_path, monkeypatch):
    root = silu(tmp_path)
    host = tmp_path / "host"
    host.mkdir()
    (host / "silu_and_mul.py").write_text("raise SystemExit('host code')\n")

    def swap():
        (root / "kernels").rename(tmp_path / "moved")
        (root / "kernels").symlink_to(host, target_is_directory=True)

    swap_after_listing(monkeypatch, "kernels", swap)
    with pytest.raises(UsageError, match="kernels: changed while the bundle was read"):
        read_snapshot(root)


def test_a_directory_replaced_by_another_mid_walk_is_refused(tmp_path, monkeypatch):
    root = silu(tmp_path)

    def swap():
        (root / "kernels").rename(tmp_path / "moved")
        shutil.copytree(tmp_path / "moved", root / "kernels")

    swap_after_listing(monkeypatch, "kernels", swap)
    with pytest.raises(UsageError, match="kernels: was replaced while the bundle was read"):
        read_snapshot(root)


def test_a_file_written_while_read_is_refused(tmp_path, monkeypatch):
    root = silu(tmp_path)

    def grow():
        with open(root / KERNEL, "a") as fh:
            fh.write("raise SystemExit('appended')\n")
        os.utime(root / KERNEL, ns=(0, 0))

    swap_after_listing(monkeypatch, "silu_and_mul.py", grow)
    with pytest.raises(UsageError, match="changed while it was read"):
        read_snapshot(root)


def test_the_copy_is_written_from_the_snapshot_not_the_path(tmp_path):
    root = silu(tmp_path)
    admission = admit(root)
    (root / KERNEL).write_text("raise SystemExit('swapped after admission')\n")
    dest = tmp_path / "copy"
    materialise(admission.snapshot, admission.manifest.declared_files(), dest)
    assert (dest / KERNEL).read_bytes() == admission.snapshot.files[KERNEL]
    assert read_snapshot(dest).digest == admission.digest != read_snapshot(root).digest
    assert stat.S_IMODE((dest / KERNEL).stat().st_mode) == 0o644


def test_the_copy_never_writes_through_what_is_already_there(tmp_path):
    admission = admit(silu(tmp_path))
    dest = tmp_path / "copy"
    dest.mkdir()
    with pytest.raises(FileExistsError):
        materialise(admission.snapshot, admission.manifest.declared_files(), dest)


def test_the_loader_imports_the_snapshot_bytes_and_checks_the_admitted_digest(tmp_path):
    root = silu(tmp_path)
    admission = admit(root)
    op = admission.manifest.ops[0]
    (root / KERNEL).write_text("raise SystemExit('swapped after admission')\n")
    assert callable(load_entry(admission.snapshot, op, digest=admission.digest))  # the disk is not read
    tampered = Snapshot(str(root), {**admission.snapshot.files, KERNEL: b"def silu_and_mul(x, out):\n    pass\n"})
    object.__setattr__(tampered, "digest", admission.digest)  # a forged digest field is not trusted either
    with pytest.raises(UsageError, match="is not the admitted"):
        load_entry(tampered, op, digest=admission.digest)


def test_a_trailing_slash_or_dot_does_not_let_a_symlinked_root_through(tmp_path):
    root = silu(tmp_path)
    (tmp_path / "link").symlink_to(root, target_is_directory=True)
    for spelled in (f"{tmp_path}/link/", f"{tmp_path}/link/.", f"{tmp_path}/link/kernels/.."):
        with pytest.raises(UsageError, match="is a symlink"):
            read_snapshot(spelled)


def test_a_directory_of_many_names_is_refused_at_the_bound(tmp_path):
    root = silu(tmp_path)
    for i in range(40):
        (root / f"n{i}.txt").write_text("")
    with pytest.raises(UsageError, match="more than 20 entries"):
        read_snapshot(root, SnapshotLimits(max_entries=20))


def test_a_filesystem_mounted_inside_the_bundle_is_not_entered(tmp_path):
    """A tmpfs holding a host file, and a file of /dev/shm, mounted inside the bundle (in a private mount namespace, by
    bubblewrap). A bind mount of a directory of the bundle's own filesystem keeps its device number
    and is not detected: making one takes a mount namespace the verifier's caller controls."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.skip("bubblewrap is not installed")
    root = silu(tmp_path)
    (root / "sub").mkdir()
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("host secret\n")
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == root.stat().st_dev:
        pytest.skip("no /dev/shm on another filesystem than the test's temporary directory")
    other = shm / f"cacheon-test-{os.getpid()}.txt"
    other.write_text("other filesystem secret\n")
    code = ("import sys; from cacheon.bundle.snapshot import read_snapshot; s = read_snapshot(sys.argv[1]); "
            "print(sorted(s.refused), sorted(s.files))")
    ran = subprocess.run([bwrap, "--dev-bind", "/", "/", "--tmpfs", str(root / "sub"), "--ro-bind",
                          str(host / "secret.txt"), str(root / "sub" / "secret.txt"), "--ro-bind", str(other),
                          str(root / "README.md"), sys.executable, "-c", code, str(root)],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    other.unlink()
    if ran.returncode and "bwrap" in ran.stderr:
        pytest.skip(f"bubblewrap cannot make a mount namespace here: {ran.stderr.strip()}")
    assert ran.returncode == 0, ran.stderr
    assert "'sub', 'mount-point'" in ran.stdout and "'README.md', 'mount-point'" in ran.stdout
    assert "secret" not in ran.stdout
