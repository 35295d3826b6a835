#!/usr/bin/env bash
# On a CUDA host: verify every example bundle on the GPU with the CUDA-graph stage and check each
# verdict against what it must be there. Collective examples need one GPU per rank (nccl); with
# fewer GPUs they are checked on CPU (gloo) by the test suite instead and skipped here. Prints one line per bundle and a summary; exits 1 if any
# verdict differs. Usage: scripts/gpu_check.sh [GRAPH_REPLAYS]   (env: PYTHON, OUT for JSON reports)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REPLAYS=${1:-3}
REPORTS=${OUT:-$(mktemp -d)}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# bundle (under examples/)  expected-exit  expected-verdict
EXPECT="
bundles/silu-torch 0 PASS
bundles/silu-triton 0 PASS
bundles/rmsnorm-torch 0 PASS
bundles/rmsnorm-triton 0 PASS
bundles/attention-torch 0 PASS
bundles/silu-broken-no-silu 2 FAIL
bundles/rmsnorm-broken-no-norm 2 FAIL
bundles/attention-broken-causal 2 FAIL
bundles/silu-cheat-writes-input 2 FAIL
bundles/silu-cheat-replaces-out 2 FAIL
bundles/silu-cheat-caches-output 2 FAIL
bundles/silu-cheat-skips-rows 2 FAIL
bundles/silu-cheat-graph-noop 2 FAIL
bundles/silu-scan-violation 2 FAIL
bundles/decode-torch 0 PASS
bundles/decode-broken-ignores-lens 2 FAIL
bundles/moe-torch 0 PASS
bundles/moe-broken-unweighted 2 FAIL
bundles/msa-block-torch 0 PASS
bundles/msa-block-broken-ignores-lens 2 FAIL
bundles/msa-prefill-torch 0 PASS
bundles/msa-prefill-broken-block-mean 2 FAIL
adversarial/cache-by-pointer 2 FAIL
adversarial/out-strides 2 FAIL
adversarial/returns-nan 2 FAIL
adversarial/low-precision 2 FAIL
adversarial/forges-verdict 2 FAIL
adversarial/graph-stale-replay 2 FAIL
adversarial/selection-masks-low-blocks 2 FAIL
adversarial/selection-leaves-masked-unwritten 2 FAIL
"

"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)' || exit 1
bad=0
if [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  EXPECT="$EXPECT
bundles/allreduce-torch 0 PASS
bundles/allreduce-broken-local 2 FAIL
bundles/ar-rmsnorm-torch 0 PASS
bundles/ar-rmsnorm-broken-no-residual 2 FAIL
bundles/moe-reduce-torch 0 PASS
bundles/moe-reduce-broken-local 2 FAIL
bundles/moe-finalize-torch 0 PASS
bundles/moe-finalize-broken-trim-stride 2 FAIL"
else
  echo "one GPU: collective examples (nccl, one GPU per rank) skipped; the CPU suite runs them with gloo"
fi
while read -r name code verdict; do
  [ -z "$name" ] && continue
  start=$(date +%s)
  file=${name//\//_}
  "$PY" -m cacheon.cli verify "examples/$name" --device cuda --graph-replays "$REPLAYS" --json \
    >"$REPORTS/$file.json" 2>"$REPORTS/$file.err"
  rc=$?
  got=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["verdict"], "|", r.get("reason",""))' "$REPORTS/$file.json" 2>/dev/null || echo "NO-REPORT | $(tail -n1 "$REPORTS/$file.err")")
  status=ok
  if [ "$rc" != "$code" ] || [ "${got%% *}" != "$verdict" ]; then status=MISMATCH; bad=$((bad + 1)); fi
  printf '%-38s exit=%s want=%s/%s  %-8s %ss  %s\n' "$name" "$rc" "$code" "$verdict" "$status" "$(( $(date +%s) - start ))" "$got"
done <<<"$EXPECT"
echo "gpu_check: $bad mismatch(es); JSON reports in $REPORTS"
[ "$bad" -eq 0 ]
