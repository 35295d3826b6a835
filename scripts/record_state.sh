#!/usr/bin/env bash
# Append this host's real checks to the project's ledger of record (records/ledger.sqlite3), which the
# documentation site's State of record page is generated from. Each record is bound to this host's
# exact runtime identity; nothing here is a claim about any other host or image.
#
# Usage: scripts/record_state.sh    (after `make setup`; takes a few minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
CACHEON="${CACHEON:-.venv/bin/cacheon}"
export CACHEON_LEDGER="$PWD/records/ledger.sqlite3"
mkdir -p records

run() {  # a check's own verdict is its record; a failing check must not stop the others
    echo "+ cacheon $*" >&2
    "$CACHEON" "$@" >/dev/null || echo "  (exit $?: recorded as such)" >&2
}

run compat --record
# The chain SDK lives beside the venv (scripts/install_chain_pin.sh), on PYTHONPATH for this check only.
PYTHONPATH="$PWD/.chain/bittensor${PYTHONPATH:+:$PYTHONPATH}" run chain-compat --record
# Negative controls for the pin-bump gate: a faithful bundle passes, a broken one fails.
run verify examples/bundles/silu-torch --record --control faithful
run verify examples/bundles/silu-broken-no-silu --record --control broken
for bundle in rmsnorm-torch attention-torch decode-torch moe-torch allreduce-torch ar-rmsnorm-torch \
        msa-block-torch msa-prefill-torch moe-reduce-torch moe-finalize-torch; do
    run verify "examples/bundles/$bundle" --record
done
"$CACHEON" evidence verify >&2
