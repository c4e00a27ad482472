#!/usr/bin/env bash
# Why dstui's rank takes longer over its first step than the bare script (issue 31): one device call, ~7 min.
#
#   bash benchmarks/gpu/diag_step1.sh   # under $OUT: probe_summary.txt, probe.tgz, spy-native.txt.gz, *.err
#
# 1. bare_vs_dstui.py with the first-step probe (benchmarks/gpu/probe): bare, dstui and dstui's runner
#    started by hand, 2 rounds after a warm-up; every rank also times one SDPA call of fixed shapes
#    before its step 1 (DSTUI_STEP1_PROBE_SDPA=1): is a slow first cuDNN attention the process's or
#    the model's?
# 2. one more round, no probe, under `py-spy record --native --subprocesses`: the native frames
#    (cuDNN, driver, dlopen) behind the first step's time.
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
. "$REPO/benchmarks/gpu/device_env.sh"
diag_setup
P=$WORK/step1/probe
rm -rf "$WORK/step1"
DSTUI_STEP1_PROBE_SDPA=1 timeout 330 $PY benchmarks/gpu/bare_vs_dstui.py --rounds 2 --warmup --timeout 200 \
    --work "$WORK/step1" --probe "$P" --skip bare_denv >"$OUT/probe-run.json" 2>"$OUT/probe-run.err"
echo "probed harness exited $?"
$PY benchmarks/gpu/probe_summary.py "$P" --tables >"$OUT/probe_summary.txt" 2>&1
tar -C "$P" -czf "$OUT/probe.tgz" .
head -12 "$OUT/probe_summary.txt"
install_pyspy
timeout -s INT 150 $PYSPY record --native --subprocesses --rate 50 --format raw -o "$OUT/spy-native.txt" -- \
    $PY benchmarks/gpu/bare_vs_dstui.py --rounds 1 --timeout 120 --work "$WORK/step1" \
    >"$OUT/spy-run.json" 2>"$OUT/spy-run.err"
echo "py-spy exited $?"
tail -4 "$OUT/spy-run.err"
gzip -f "$OUT/spy-native.txt"
ls -la "$OUT"
