#!/usr/bin/env bash
# On a CUDA host: verify every example bundle on the GPU with the CUDA-graph stage and check each
# verdict against what it must be there. Collective examples need one GPU per rank (nccl); with
# fewer GPUs they are checked on CPU (gloo) by the test suite instead and skipped here. Prints one line per bundle and a summary; exits 1 if any
# verdict differs. Usage: scripts/gpu_check.sh [GRAPH_REPLAYS]   (env: PYTHON, OUT for JSON reports)
# With SERVE_ENGINE (a CUDA server venv's bin/python holding the SGLang pin) and SERVE_MODEL (a model
# directory), it also serves silu-torch confined on the GPU (`cacheon serve --device cuda`: the sandbox
# binds /dev/nvidia* and nothing else of /dev) and checks the armed server answers greedily, as the
# unarmed one does. Never run here: this CPU-only machine has no GPU.
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
# serve_check BUNDLE|-  ->  prints the greedy output ids of one prompt from a confined GPU server
serve_check() {
  local log="$REPORTS/serve-${1//\//_}.out" bundle=() pid line
  [ "$1" != "-" ] && bundle=(--bundle "examples/$1")
  "$PY" -m cacheon.cli serve --engine "$SERVE_ENGINE" --model "$SERVE_MODEL" "${bundle[@]}" --device cuda \
    --port 39300 --kv-port 39301 --replay-port 39302 -- --dtype float32 --random-seed 0 >"$log" 2>"$log.err" &
  pid=$!
  for _ in $(seq 600); do line=$(head -n1 "$log" 2>/dev/null); [ -n "$line" ] && break; kill -0 $pid 2>/dev/null || break; sleep 1; done
  "$PY" - "$line" <<'PYEOF' || echo "serve-failed"
import json, sys, urllib.request
info = json.loads(sys.argv[1])
assert info["confinement"] == "bubblewrap" and info["devices"] == "/dev/nvidia*", info
body = {"text": "The capital of France is Paris. The capital of Japan is",
        "sampling_params": {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}}
req = urllib.request.Request(info["url"] + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=300))["output_ids"])
PYEOF
  kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
}
if [ -n "${SERVE_ENGINE:-}" ] && [ -n "${SERVE_MODEL:-}" ]; then
  stock=$(serve_check -); armed=$(serve_check bundles/silu-torch)
  if [ "$stock" = "$armed" ] && [ "${stock#serve-failed}" = "$stock" ]; then echo "serve (confined, cuda): faithful = stock  ok"
  else echo "serve (confined, cuda): MISMATCH stock=$stock armed=$armed (logs in $REPORTS)"; bad=$((bad + 1)); fi
else
  echo "serve (confined, cuda): skipped (set SERVE_ENGINE and SERVE_MODEL)"
fi
# The sandbox on the GPU: only /dev/nvidia* added to bubblewrap's own /dev, CUDA works under the
# seccomp filter and the tree bound, nested user namespaces and refused syscalls still refused.
# (A probe bundle needs os/ctypes, which the scan refuses: verify_bundle is called directly.)
PYTHONPATH="$PWD:$PYTHONPATH" "$PY" - <<'PROBE'
import ast, sys, tempfile, textwrap
from pathlib import Path
from cacheon.bundle.snapshot import read_snapshot
from cacheon.bundle.manifest import load_manifest
from cacheon.verify.plan import VerifyOptions
from cacheon.verify.runner import verify_bundle
from tests.conftest import write_bundle
probe = textwrap.dedent("""
    import ctypes, os, platform, torch
    libc = ctypes.CDLL(None, use_errno=True)
    keyctl = {"x86_64": 250, "aarch64": 219}[platform.machine()]
    assert torch.cuda.is_available() and torch.ones(4, device="cuda").sum().item() == 4
    refused = {"unshare": libc.unshare(0x10000000), "keyctl": libc.syscall(keyctl, 0, -2, 1)}
    print("DEV", sorted(os.listdir("/dev")), "REFUSED", refused, flush=True)


    def silu_and_mul(x, out):
        d = x.shape[-1] // 2
        out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
""")
root = write_bundle(Path(tempfile.mkdtemp()), "activation.silu_and_mul", "silu_and_mul", probe)
report = verify_bundle(snapshot := read_snapshot(root), load_manifest(snapshot),
                       VerifyOptions(device="cuda", dtypes=("float32",), stability_calls=10))
op = report.ops[0]
line = next((l for l in op.candidate_output.splitlines() if l.startswith("DEV ")), "")
dev = ast.literal_eval(line.split(" REFUSED ")[0][4:]) if line else None
base = {"console", "core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
        "tty", "urandom", "zero"}
problems = []
if report.verdict not in ("PASS", "NUMERICAL_PASS"):
    problems.append(f"verdict {report.verdict}: {report.reason}")
if dev is None or any(n not in base and not n.startswith("nvidia") for n in dev):
    problems.append(f"/dev in the sandbox: {dev}")
if "REFUSED {'unshare': -1, 'keyctl': -1}" not in line:
    problems.append(f"not refused: {line}")
for key in ("nested_userns", "seccomp", "aggregate_bound"):
    print(f"sandbox {key}: {op.confinement.get(key)}")
print("sandbox on cuda:", "; ".join(problems) or "ok", f"(/dev: {dev})")
sys.exit(1 if problems else 0)
PROBE
[ $? -eq 0 ] || bad=$((bad + 1))
echo "gpu_check: $bad mismatch(es); JSON reports in $REPORTS"
[ "$bad" -eq 0 ]
