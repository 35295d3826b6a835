#!/usr/bin/env bash
# Install the pinned SGLang runtime into a CPU virtualenv so its real code can be imported and run.
#
# Why not `pip install sglang==PIN`: the wheel's metadata pins torch==2.11 and dozens of CUDA packages.
# Cacheon keeps torch 2.13.0+cpu, so SGLang goes in with --no-deps, followed by exactly the pure-Python
# packages its import chain needs on CPU (measured by importing, see PIP_PACKAGES), under a constraint
# that forbids touching torch/triton.
#
# torchvision: SGLang imports `torchvision.io` at top level, and PyPI's torchvision does not load beside
# a CPU torch ("operator torchvision::nms does not exist"). We install a STAND-IN instead: a tiny wheel
# named torchvision, version 0.0.0+cacheon.standin, whose names exist so imports succeed and which
# raises on any use (built by scripts/standins/build_wheel.py, which the server installer shares).
# Environment capture lists it from importlib.metadata, so no record claims it.
#
# Idempotent; fast (metadata check only, then one import smoke test) when everything is already there.
# Usage: VENV=.venv scripts/install_sglang_pin.sh   (on success writes $SGLANG_PIN_READY, default .sglang-pin-ready)
set -euo pipefail

SGLANG_PIN="0.5.13.post1"
STANDIN_VERSION="0.0.0+cacheon.standin"
# Measured at the pin by importing sglang plus every module in cacheon.runtime.seams in a fresh CPU venv.
# Exact versions where SGLang's metadata pins them (openai, transformers), otherwise the version measured;
# a bare name (shared with Cacheon's own dependencies) only has to be present.
PIP_PACKAGES=(
    "msgspec"
    "numpy"
    "psutil"
    "pyzmq"
    "aiohttp==3.14.5"
    "compressed-tensors==0.20.1"
    "dill==0.4.1"
    "einops==0.8.2"
    "fastapi==0.165.0"
    "gguf==0.19.0"
    "ipython==9.18.1"
    "openai==2.6.1"
    "orjson==3.13.0"
    "partial-json-parser==0.2.1.1.post7"
    "pillow==13.0.0"
    "pybase64==1.5.1"
    "requests==2.34.2"
    "sentencepiece==0.2.3"
    "setproctitle==1.3.8"
    "starlette==1.10.0"
    "tqdm==4.70.1"
    "transformers==5.8.1"
    "uvicorn==0.54.0"
    "uvloop==0.23.0"
)
SMOKE="import sglang; import sglang.srt.layers.activation, sglang.srt.layers.layernorm, sglang.srt.mem_cache.radix_cache"
SMOKE="$SMOKE, sglang.srt.entrypoints.engine, sglang.srt.layers.moe.fused_moe_triton.layer, sglang.srt.plugins"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "install_sglang_pin: no python at $PY (set VENV)" >&2; exit 1; }
READY="${SGLANG_PIN_READY:-$ROOT/.sglang-pin-ready}"
rm -f "$READY"

# torch and triton must already be there (make setup installs the CPU build); never let pip replace them.
CONSTRAINTS="$(mktemp)"
WORK="$(mktemp -d)"
trap 'rm -rf "$CONSTRAINTS" "$WORK"' EXIT
"$PY" - "$CONSTRAINTS" <<'EOF'
import importlib.metadata as md
import sys

lines = []
for dist in ("torch", "triton"):
    try:
        lines.append(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        sys.exit(f"install_sglang_pin: {dist} is not installed in this venv; install the CPU torch build first")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
EOF

# Which of the wanted distributions are missing or at another version? (metadata only: fast)
MISSING="$("$PY" - "$SGLANG_PIN" "$STANDIN_VERSION" "${PIP_PACKAGES[@]}" <<'EOF'
import importlib.metadata as md
import sys

pin, standin, *specs = sys.argv[1:]
wanted = [("sglang", pin), ("torchvision", standin)] + [(*s.split("==", 1), None)[:2] for s in specs]
for name, version in wanted:
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = None
    if have is None or (version is not None and have != version):
        print(name)
EOF
)"

if [ -n "$MISSING" ]; then
    echo "install_sglang_pin: installing into $VENV: $(echo $MISSING | tr '\n' ' ')"
    if grep -qx torchvision <<<"$MISSING"; then
        # The stand-in wheel is built by the one builder every installer shares (no network).
        "$PY" "$ROOT/scripts/standins/build_wheel.py" torchvision "$WORK" >/dev/null
        "$PY" -m pip install -q --no-deps --force-reinstall "$WORK"/torchvision-*.whl
    fi
    if grep -qx sglang <<<"$MISSING"; then
        "$PY" -m pip install -q --no-deps "sglang==$SGLANG_PIN"
    fi
    # pip's resolver complains that sglang wants torch==2.11 and CUDA packages: expected, filtered.
    if ! "$PY" -m pip install -q -c "$CONSTRAINTS" "${PIP_PACKAGES[@]}" >"$WORK/pip.log" 2>&1; then
        cat "$WORK/pip.log" >&2
        exit 1
    fi
    grep -v -E "^(ERROR: pip's dependency resolver|sglang $SGLANG_PIN requires|WARNING: Location)" "$WORK/pip.log" || true
fi

if ! "$PY" -W ignore -c "$SMOKE" >"$WORK/smoke.log" 2>&1; then
    tail -20 "$WORK/smoke.log" >&2
    echo "install_sglang_pin: SGLang $SGLANG_PIN is installed but does not import (see above)" >&2
    exit 1
fi
echo "sglang $SGLANG_PIN $(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$READY"
echo "install_sglang_pin: sglang $SGLANG_PIN ready in $VENV (torchvision is a stand-in: $STANDIN_VERSION)"
