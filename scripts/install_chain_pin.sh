#!/usr/bin/env bash
# Install the pinned Bittensor SDK (with its dependency closure) into its own --target directory.
#
# Why a separate directory, not the venv: the SDK brings compiled wheels (bittensor-wallet, bt-decode,
# bittensor-drand) and its own pins of aiohttp/websockets/pydantic; keeping them out of the engine venv
# means a chain-SDK change can never perturb (or be mistaken for) an engine change. `cacheon chain-compat`
# runs with PYTHONPATH=<this directory> (tests/runtime/test_chain_compat_real.py does exactly that).
#
# Idempotent: skipped when the pinned dist-info is already there.
# Usage: VENV=.venv CHAIN_TARGET=.chain/bittensor scripts/install_chain_pin.sh
set -euo pipefail

BITTENSOR_PIN="10.5.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
TARGET="${CHAIN_TARGET:-$ROOT/.chain/bittensor}"

if compgen -G "$TARGET/bittensor-$BITTENSOR_PIN.dist-info" >/dev/null; then
    echo "install_chain_pin: bittensor $BITTENSOR_PIN already in $TARGET"
    exit 0
fi
rm -rf "$TARGET.partial"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
    --target "$TARGET.partial" "bittensor==$BITTENSOR_PIN" 2>&1 | grep -v -E "^(ERROR: pip.s dependency resolver|sglang |WARNING: Location)" || true
compgen -G "$TARGET.partial/bittensor-$BITTENSOR_PIN.dist-info" >/dev/null \
    || { echo "install_chain_pin: pip did not install bittensor $BITTENSOR_PIN" >&2; exit 1; }
rm -rf "$TARGET"
mv "$TARGET.partial" "$TARGET"
echo "install_chain_pin: bittensor $BITTENSOR_PIN ready in $TARGET"
