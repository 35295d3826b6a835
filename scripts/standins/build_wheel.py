#!/usr/bin/env python3
"""Build a named Cacheon stand-in wheel (no build backend, no network): ``build_wheel.py NAME OUT_DIR``.

A stand-in exists only where the real package cannot run on this CPU-only machine, and is named as
one: its version is ``0.0.0+cacheon.standin`` (runtime identity capture lists every such
distribution), every module it ships answers any public name with a placeholder that raises when
called, and only the ops listed below are real (plain torch). It is never evidence for the engine.

- ``torchvision``: SGLang and transformers import ``torchvision.io`` / ``transforms(.v2)`` at module
  level, and PyPI's torchvision does not load beside a CPU torch (``torchvision::nms does not exist``).
- ``sgl-kernel``: no CPU build is on PyPI (the CUDA wheels do not load; the real CPU kernels need
  AVX-512/AMX). From 0.5.18 a CPU server calls one op of it, ``assign_req_to_token_pool_cpu``
  (sgl_kernel_cpu.py here); everything else raises.

Prints the wheel's path.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNTIME = HERE / "_standin.py"


@dataclass(frozen=True)
class StandIn:
    dist: str
    package: str
    summary: str
    modules: tuple[str, ...] = ("__init__",)  # placeholder modules, relative to the package
    real: dict[str, str] = field(default_factory=dict)  # module in the package -> source file here
    exports: dict[str, tuple[str, ...]] = field(default_factory=dict)  # placeholder module -> real names


STANDINS = {
    s.dist: s
    for s in (
        StandIn(
            "torchvision",
            "torchvision",
            "Cacheon import stand-in for torchvision (not torchvision; any use raises)",
            modules=(
                "__init__",
                "io",
                "transforms/__init__",
                "transforms/functional",
                "transforms/v2/__init__",
                "transforms/v2/functional",
            ),
        ),
        StandIn(
            "sgl-kernel",
            "sgl_kernel",
            "Cacheon CPU stand-in for sgl-kernel (not sgl-kernel; one op in plain torch, any other use raises)",
            real={"_cpu_ops": "sgl_kernel_cpu.py"},
            exports={"__init__": ("_cpu_ops", "assign_req_to_token_pool_cpu")},
        ),
    )
}


def _version() -> str:
    namespace: dict[str, object] = {}
    exec(compile(RUNTIME.read_text(encoding="utf-8"), str(RUNTIME), "exec"), namespace)
    return str(namespace["VERSION"])


def _placeholder(package: str, module: str, exports: tuple[str, ...]) -> str:
    dotted = package + ("" if module == "__init__" else "." + module.removesuffix("/__init__").replace("/", "."))
    lines = [f'"""Cacheon import stand-in ({dotted}; not the real package)."""']
    lines.append(f"from {package}._standin import VERSION as __version__")
    lines.append(f"from {package}._standin import module_getattr")
    if exports:
        source, *names = exports
        lines.append(f"from {package}.{source} import {', '.join(names)}")
    lines += ["", f"__getattr__ = module_getattr({dotted!r})", ""]
    return "\n".join(lines)


def files_of(standin: StandIn) -> dict[str, str]:
    """Every file of the wheel but RECORD: path inside the wheel -> text."""
    version = _version()
    files = {f"{standin.package}/_standin.py": RUNTIME.read_text(encoding="utf-8")}
    for module in standin.modules:
        exports = standin.exports.get(module, ())
        files[f"{standin.package}/{module}.py"] = _placeholder(standin.package, module, exports)
    for module, source in standin.real.items():
        files[f"{standin.package}/{module}.py"] = (HERE / source).read_text(encoding="utf-8")
    dist_info = f"{standin.dist.replace('-', '_')}-{version}.dist-info"
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {standin.dist}\nVersion: {version}\nSummary: {standin.summary}\n"
    )
    files[f"{dist_info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: cacheon\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    return files


def build(dist: str, out: Path) -> Path:
    standin = STANDINS[dist]
    files = files_of(standin)
    version = _version()
    dist_info = f"{standin.dist.replace('-', '_')}-{version}.dist-info"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{standin.dist.replace('-', '_')}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in sorted(files.items()):
            data = text.encode("utf-8")
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={sha},{len(data)}")
            wheel.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
        record.append(f"{dist_info}/RECORD,,")
        record_info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        wheel.writestr(record_info, "\n".join(record) + "\n")
    return path


def source_digest(dists: list[str]) -> str:
    """A digest of what the named stand-ins would contain (installers use it to notice a change)."""
    sha = hashlib.sha256()
    for dist in sorted(dists):
        for name, text in sorted(files_of(STANDINS[dist]).items()):
            sha.update(f"{name}\0{text}\0".encode())
    return sha.hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in STANDINS:
        print(f"usage: build_wheel.py {{{','.join(STANDINS)}}} OUT_DIR", file=sys.stderr)
        return 1
    print(build(argv[0], Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
