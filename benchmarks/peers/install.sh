#!/usr/bin/env bash
# Install the routing benchmarks' peers, each into its own venv under .peers/<name>/ (gitignored):
#   sglang-router      SGLang's own router (Rust, PyPI `sglang-router`), for benchmarks/routing_peers.py
#                      and benchmarks/gateway_proxy.py
#   ai-dynamo-runtime  NVIDIA Dynamo's runtime, whose Python bindings expose `dynamo.llm.RadixTree`,
#                      for benchmarks/kv_query.py, kv_ingest.py and kv_memory.py --peer dynamo
#
# Why their own venvs: neither is a Cacheon dependency, and their pins (pydantic, fastapi, uvloop)
# must not move the project's. Neither pulls torch; the script checks that no torch arrived.
# Idempotent: a peer whose venv already imports the pinned version is skipped.
#
# Usage: benchmarks/peers/install.sh [NAME...]   (default: both)
# Env:   PYTHON (default python3), PEERS_DIR (default .peers)
set -euo pipefail

cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
DEST="${PEERS_DIR:-.peers}"

declare -A SPEC=([sglang-router]="sglang-router==0.3.2" [ai-dynamo-runtime]="ai-dynamo-runtime==1.6.1")
declare -A PROBE=([sglang-router]="sglang_router" [ai-dynamo-runtime]="dynamo.llm")

if [ -L "$DEST" ] && [ ! -d "$DEST" ]; then  # a link left from another machine: say so, not "mkdir failed"
    echo "$DEST is a link to $(readlink "$DEST"), which does not exist here: remove it (rm $DEST) or set PEERS_DIR" >&2
    exit 1
fi
mkdir -p "$DEST"

names=("$@")
[ "${#names[@]}" -gt 0 ] || names=(sglang-router ai-dynamo-runtime)

for name in "${names[@]}"; do
    spec="${SPEC[$name]:-}"
    if [ -z "$spec" ]; then
        echo "unknown peer '$name' (known: ${!SPEC[*]})" >&2
        exit 1
    fi
    venv="$DEST/$name"
    version="${spec#*==}"
    if [ -x "$venv/bin/python" ] && [ "$("$venv/bin/python" -m pip show "${spec%%==*}" 2>/dev/null \
            | sed -n 's/^Version: //p')" = "$version" ]; then
        echo "$name $version: already in $venv"
        continue
    fi
    echo "$name $version: installing into $venv"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$spec"
    "$venv/bin/python" -c "import ${PROBE[$name]}"
    if "$venv/bin/python" -m pip show torch >/dev/null 2>&1; then
        echo "$name pulled in torch: refusing (the peers must stay CPU-light)" >&2
        exit 1
    fi
done
