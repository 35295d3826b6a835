import gzip
import io
import os
import tarfile
import tracemalloc
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


def test_archives_are_byte_identical(tmp_path):
    a = copy_bundle(tmp_path / "a")
    b = copy_bundle(tmp_path / "b")
    os.utime(b / "manifest.toml", (1, 1))
    da = write_archive(a, tmp_path / "a.tar.gz")
    db = write_archive(b, tmp_path / "b.tar.gz")
    assert da == db == bundle_digest(a)
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    with open_bundle(tmp_path / "a.tar.gz") as root:
        assert bundle_digest(root) == da


def test_bytecode_is_content_refused_by_packaging_and_extraction(tmp_path):
    """Caches are no longer skipped silently: the digest counts them and packaging refuses them."""
    a = copy_bundle(tmp_path / "a")
    before = bundle_digest(a)
    (a / "kernels" / "__pycache__").mkdir()
    (a / "kernels" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    assert bundle_digest(a) != before
    with pytest.raises(UsageError, match="is bytecode"):
        write_archive(a, tmp_path / "a.tar.gz")
    for name in ("kernels/__pycache__/k.cpython-311.pyc", "k.pyc"):
        dest = tmp_path / name.replace("/", "_")
        dest.mkdir()
        with pytest.raises(UsageError, match="is bytecode"):
            extract_archive(tar_with(tmp_path, member(name)), dest)
        assert list(dest.iterdir()) == []


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


def _gzip_of(path: Path, chunks) -> Path:
    """A .tar.gz written piece by piece (level 1: a bomb of zeros stays small on disk)."""
    with gzip.open(path, "wb", compresslevel=1) as gz:
        for chunk in chunks:
            gz.write(chunk)
    return path


def _header(name: bytes, size: int, kind: bytes) -> bytes:
    info = tarfile.TarInfo(name.decode())
    info.size, info.type = size, kind
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _bounded(call) -> tuple[int, str]:
    """Peak Python heap of ``call`` in bytes and its UsageError message (it must raise one)."""
    tracemalloc.start()
    try:
        with pytest.raises(UsageError) as info:
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, str(info.value)


@pytest.mark.parametrize(("kind", "label"), [(b"x", "pax"), (b"g", "pax global"), (b"L", "GNU long-name"),
                                              (b"K", "GNU long-link")])
def test_header_bombs_are_refused_before_tarfile_reads_them(tmp_path, kind, label):
    """A 1 GiB extension header (tarfile would read it whole) is refused at its header block."""
    zeros = b"\0" * (1 << 20)
    bomb = _gzip_of(tmp_path / "bomb.tar.gz", [_header(b"././@x", 1 << 30, kind), *([zeros] * 64)])
    peak, message = _bounded(lambda: extract_archive(bomb, tmp_path / "d"))
    assert f"a {label} header of {1 << 30} bytes (limit 65536)" in message
    assert peak < 4 << 20


def test_pax_size_override_is_honoured(tmp_path):
    """A pax 'size' record larger than the limit is caught even when the ustar size field says 0."""
    record = b"size=999999999\n"
    record = str(len(record) + 3).encode() + b" " + record
    pax = _header(b"././@PaxHeader", len(record), b"x") + record.ljust(512, b"\0")
    bomb = _gzip_of(tmp_path / "pax.tar.gz", [pax, _header(b"k.py", 0, tarfile.REGTYPE)])
    _peak, message = _bounded(lambda: extract_archive(bomb, tmp_path / "d"))
    assert "a member of 999999999 bytes" in message


def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path):
    """Members each under the file limit whose total decompresses far past the content limit."""
    body = b"\0" * (4 << 20)
    chunks = []
    for i in range(32):  # 128 MiB decompressed, a few hundred KiB on disk
        chunks += [_header(f"f{i}".encode(), len(body), tarfile.REGTYPE), body]
    bomb = _gzip_of(tmp_path / "gz.tar.gz", chunks)
    assert bomb.stat().st_size < 2 << 20
    dest = tmp_path / "d"
    dest.mkdir()
    peak, message = _bounded(lambda: extract_archive(bomb, dest))
    assert "decompresses to more than" in message or "content exceeds" in message
    assert peak < 4 << 20
