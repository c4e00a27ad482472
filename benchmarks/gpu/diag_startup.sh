#!/usr/bin/env bash
# Where `dstui run`'s time before the rank launch goes on a GPU host (issue 31): one device call.
#
#   bash benchmarks/gpu/diag_startup.sh        # ~4 min on 1 GPU, results under $OUT
#
# After validate.sh's set-up and FusedAdam build: the pieces a `dstui run` goes through, each timed
# alone (nvidia-smi, torch's CUDA start, `dstui run --dry-run`), then one warm `dstui run` of
# bare_vs_dstui.py's llama-1b spec (3 steps) and the same again (a) with the CLI under cProfile and
# every Python process printing its import times (PYTHONPROFILEIMPORTTIME), (b) under py-spy with its
# subprocesses (supervisor, launcher, rank), where ptrace is allowed. Timestamps of the batch's
# supervisor.log and status.json place the rank's launch on the same clock.
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
. "$REPO/benchmarks/gpu/device_env.sh"
diag_setup
tail -3 "$OUT/diag-setup.txt"
export DSTUI_HOME=$WORK/diag-home CUDA_VISIBLE_DEVICES=0 PYTHONPYCACHEPREFIX=$WORK/pycache
unset PYTHONDONTWRITEBYTECODE  # the image sets it: with a cache prefix nothing would be cached
mkdir -p "$DSTUI_HOME"
D=$WORK/diag
mkdir -p "$D"
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
t() { local s=$EPOCHREALTIME; "$@" >/dev/null; echo "[diag] $(since "$s") s: $*" >&2; }

$PY - "$D" <<'EOF'
import argparse, sys
from pathlib import Path
sys.path.insert(0, "benchmarks/gpu")
from bare_vs_dstui import write_spec
a = argparse.Namespace(model="llama-1b", dataset="synthetic", seq_length=2048, micro_batch=4, steps=3, dtype="bf16",
                       seed=42, zero_stage=1, torch_adam=False)
print(write_spec(Path(sys.argv[1]), a))
EOF
SPEC=$D/bare_vs_dstui.yaml
{
    t nvidia-smi -L
    t nvidia-smi --query-gpu=index,memory.total,memory.used --format=csv,noheader
    t $PY -c "import torch"
    t $PY -c "import torch; torch.cuda.is_available()"
    t $PY -c "import torch; torch.cuda.init(); torch.cuda.get_device_properties(0)"
    t $PY -c "import pynvml; pynvml.nvmlInit(); pynvml.nvmlDeviceGetCount()"
    t $PY -c "import deepspeed"
    t $PY -c "import mlflow"
    t $PY -m dstui --help
    t $PY -m dstui run "$SPEC" --dry-run
    t $PY -m dstui run "$SPEC" --dry-run
    t $PY -m dstui run "$SPEC" --quiet            # warm: op cache, bytecode, store
} >"$OUT/diag-pieces.txt" 2>&1
cat "$OUT/diag-pieces.txt" | grep "^\[diag\]"

# (a) CLI under cProfile; every process's import times into its stderr (the supervisor's: its log)
s=$EPOCHREALTIME
PYTHONPROFILEIMPORTTIME=1 $PY -m cProfile -o "$D/cli.prof" -m dstui run "$SPEC" --quiet 2>"$D/cli-importtime.txt"
echo "[diag] $(since "$s") s: dstui run under cProfile + importtime (start $s)"
$PY - "$D/cli.prof" >"$D/cli-prof.txt" <<'EOF'
import pstats, sys
p = pstats.Stats(sys.argv[1]); p.sort_stats("cumulative").print_stats(60); p.sort_stats("tottime").print_stats(25)
EOF
# (b) py-spy over the CLI and its subprocesses
install_pyspy
s=$EPOCHREALTIME
$PYSPY record --subprocesses --idle --rate 50 --format raw -o "$D/pyspy.txt" -- \
    $PY -m dstui run "$SPEC" --quiet >"$D/pyspy.log" 2>&1
echo "[diag] $(since "$s") s: dstui run under py-spy (rc $?; start $s)"
tail -3 "$D/pyspy.log"
# each batch's clock: batch folder, supervisor lines, the run's launch/first step
for b in "$DSTUI_HOME"/runs/*/; do
    echo "## $b"; stat -c '%.9Y batch.json' "$b/batch.json" 2>/dev/null
    head -c 3000 "$b/supervisor.log" 2>/dev/null | grep -v "^ *[0-9.]* *|" | head -40
    for r in "$b"/*/status.json; do $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('started','ended','state','phase')})" "$r"; done
    grep -h '"phases"' "$b"/*/metrics.jsonl 2>/dev/null | head -2
done >"$D/batches.txt" 2>&1
tar -C "$WORK" -czf "$OUT/diag.tgz" diag diag-home/runs 2>/dev/null
ls -la "$OUT"
