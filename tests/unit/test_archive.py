import io
import os
import tarfile
from pathlib import Path

import pytest

from cacheon.bundle.archive import ArchiveLimits, extract_archive, open_bundle, write_archive
from cacheon.bundle.digest import bundle_digest
from cacheon.errors import UsageError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "silu-torch"


def copy_bundle(dst: Path) -> Path:
    for src in EXAMPLE.rglob("*"):
        if src.is_file() and "__pycache__" not in src.parts:
            target = dst / src.relative_to(EXAMPLE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
    return dst


def test_archives_are_byte_identical_and_digest_ignores_caches(tmp_path):
    a = copy_bundle(tmp_path / "a")
    b = copy_bundle(tmp_path / "b")
    os.utime(b / "manifest.toml", (1, 1))
    (b / "kernels" / "__pycache__").mkdir()
    (b / "kernels" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    da = write_archive(a, tmp_path / "a.tar.gz")
    db = write_archive(b, tmp_path / "b.tar.gz")
    assert da == db == bundle_digest(a)
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    with open_bundle(tmp_path / "a.tar.gz") as root:
        assert bundle_digest(root) == da


def test_digest_changes_with_any_byte_or_name(tmp_path):
    a = copy_bundle(tmp_path / "a")
    before = bundle_digest(a)
    (a / "NOTES").write_text("x")
    assert bundle_digest(a) != before


def tar_with(tmp_path: Path, *members: tarfile.TarInfo, data: bytes = b"x") -> Path:
    path = tmp_path / "evil.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def member(name: str, kind=tarfile.REGTYPE, size=1, link="") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size if kind == tarfile.REGTYPE else 0, link
    return info


@pytest.mark.parametrize(
    ("info", "message"),
    [
        (member("../escape.py"), "escapes the bundle"),
        (member("/abs.py"), "is absolute"),
        (member("link.py", tarfile.SYMTYPE, link="/etc/passwd"), "link or special file"),
        (member("hard.py", tarfile.LNKTYPE, link="manifest.toml"), "link or special file"),
        (member("dev", tarfile.CHRTYPE), "link or special file"),
    ],
)
def test_hostile_members_are_refused_without_writing_outside(tmp_path, info, message):
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UsageError, match=message):
        extract_archive(tar_with(tmp_path, info), dest)
    assert not (tmp_path / "escape.py").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "evil.tar.gz"]


def test_limits(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    many = tar_with(tmp_path, *(member(f"f{i}") for i in range(5)))
    with pytest.raises(UsageError, match="more than 4 members"):
        extract_archive(many, dest, ArchiveLimits(max_members=4))
    big = tar_with(tmp_path, member("big", size=100), data=b"x" * 100)
    with pytest.raises(UsageError, match="limit 10"):
        extract_archive(big, tmp_path / "d2", ArchiveLimits(max_file_bytes=10))
    total = tar_with(tmp_path, member("a", size=8), member("b", size=8), data=b"x" * 8)
    with pytest.raises(UsageError, match="content exceeds 12"):
        extract_archive(total, tmp_path / "d3", ArchiveLimits(max_total_bytes=12))


def test_not_an_archive(tmp_path):
    bogus = tmp_path / "x.tar.gz"
    bogus.write_bytes(b"not gzip")
    with pytest.raises(UsageError, match="not a readable"), open_bundle(bogus):
        pass
    with pytest.raises(UsageError, match="does not exist"), open_bundle(tmp_path / "nope"):
        pass
