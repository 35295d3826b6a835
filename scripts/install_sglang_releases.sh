#!/usr/bin/env bash
# Unpack each SGLang release the KV-event interop matrix covers into .sglang/<version>.
#
# Why --no-deps --target: the interop tests load only each release's own kv_events module
# (and the few pure-Python modules it imports) from that directory, so one venv can hold
# every release side by side without installing seven conflicting engines.
# Idempotent: a release whose dist-info is already present is skipped.
#
# Usage: scripts/install_sglang_releases.sh [VERSION...]   (default: the whole matrix)
# Env:   PYTHON (default .venv/bin/python), SGLANG_RELEASES_DIR (default .sglang)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
DEST="${SGLANG_RELEASES_DIR:-.sglang}"

if [ "$#" -gt 0 ]; then
    versions=("$@")
else
    # One source of truth: the versions the contract registry names.
    mapfile -t versions < <(PYTHONPATH=src "$PYTHON" -c \
        'from cacheon.kv.contracts import INTEROP_RELEASES; print("\n".join(INTEROP_RELEASES))')
    if [ "${#versions[@]}" -eq 0 ]; then
        echo "could not read the release list from cacheon.kv.contracts" >&2
        exit 1
    fi
fi

for version in "${versions[@]}"; do
    target="$DEST/$version"
    if compgen -G "$target/sglang-$version.dist-info" >/dev/null; then
        echo "sglang $version: already in $target"
        continue
    fi
    rm -rf "$target.partial"
    echo "sglang $version: installing into $target"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
        --target "$target.partial" "sglang==$version"
    rm -rf "$target"
    mv "$target.partial" "$target"
done
