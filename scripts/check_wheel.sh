#!/usr/bin/env bash
# "Installed from a wheel": build the wheel, install it into a fresh venv, and run `cacheon demo` from an
# unrelated directory with an empty per-user cache, so the SGLang release the simulator publishes with is
# installed there on first use. Nothing of the checkout is on the path.
#
# Usage: scripts/check_wheel.sh            Env: PYTHON (default python3), KEEP=1 keeps the work directory
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
work="$(mktemp -d /tmp/cacheon-wheel.XXXXXX)"
[ "${KEEP:-}" = 1 ] || trap 'rm -rf "$work"' EXIT

"$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$work/dist" .
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "$work"/dist/cacheon-*.whl
cd "$work"
env -u SGLANG_RELEASES_DIR XDG_CACHE_HOME="$work/cache" \
    "$work/venv/bin/cacheon" demo --workers 2 --sessions 2 --turns 2 --delay-ms 0 --json > demo.json
test -f "$work/cache/cacheon/sglang-releases/0.5.13.post1/sglang/srt/disaggregation/kv_events.py"
"$work/venv/bin/python" -c '
import json, sys
rows = json.load(open("demo.json"))
assert [r["policy"] for r in rows] == ["rr", "approx", "exact"], rows
assert all(0 <= r["hit_rate"] <= 1 for r in rows), rows
'
# The KV path's native parts are in the wheel (a platform wheel), loaded from the venv, not from a checkout.
"$work/venv/bin/python" -c '
import sys
from cacheon.kv import _blockindex, _events
assert all(m.__file__.startswith(sys.prefix) and m.__file__.endswith(".so") for m in (_blockindex, _events))
'
ls "$work"/dist/cacheon-*.whl | grep -qv -- '-none-any\.whl$'
# The gateway dashboard's static files are package data.
"$work/venv/bin/python" -c '
from importlib import resources
from cacheon.gateway.dashboard import STATIC
assert all((resources.files("cacheon.gateway") / "static" / name).is_file() for name in STATIC)
'
# Without torch (the wheel does not pull it): help, slots, new, scan and package work; verify says what to install.
cli="$work/venv/bin/cacheon"
! "$work/venv/bin/python" -c 'import torch' 2>/dev/null || { echo "torch is in the fresh venv" >&2; exit 1; }
"$cli" --help > /dev/null
for command in slots new scan package; do "$cli" "$command" --help > /dev/null; done
"$cli" slots > /dev/null
"$cli" new activation.silu_and_mul starter > /dev/null
"$cli" scan starter > /dev/null
"$cli" package starter --out starter.tar.gz > /dev/null
if "$cli" verify starter 2> err.txt; then echo "verify ran without torch" >&2; exit 1; fi
grep -q "torch is not installed; \`cacheon verify\` needs it: pip install torch" err.txt
test "$(wc -l < err.txt)" -eq 1
# A command that needs a missing release says how to get it, in one line.
if env -u SGLANG_RELEASES_DIR XDG_CACHE_HOME="$work/empty" "$work/venv/bin/cacheon" sim worker --port 1 \
        --kv-port 2 --sglang-version 0.5.23 2> err.txt; then
    echo "sim worker started without its release" >&2; exit 1
fi
grep -q "run \`cacheon sim install-releases 0.5.23 --releases-dir $work/empty/cacheon/sglang-releases\`" err.txt
test "$(wc -l < err.txt)" -eq 1
echo "ok: wheel installed in a fresh venv; slots/new/scan/package without torch; cacheon demo ran from $work with the release installed into its cache"
