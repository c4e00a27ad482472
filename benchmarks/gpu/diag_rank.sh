#!/usr/bin/env bash
# The bare script's rank and dstui's rank side by side under py-spy (issue 31): one device call, ~4 min.
#
#   bash benchmarks/gpu/diag_rank.sh     # results under $OUT: spy.txt (py-spy raw, every process), b2.{json,err}
#
# bare_vs_dstui.py (one warm-up launch of each, then one counted round) runs under
# `py-spy record --subprocesses`, so the bare script's rank and dstui's rank (and dstui's CLI,
# supervisor, wrapper) are sampled by the same clock; their model and first-step phases can then
# be compared frame by frame.
set -u -o pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
. "$REPO/benchmarks/gpu/device_env.sh"
diag_setup
install_pyspy
$PYSPY record --subprocesses --rate 100 --format raw -o "$OUT/spy.txt" -- \
    $PY benchmarks/gpu/bare_vs_dstui.py --rounds 1 --warmup --timeout 200 --work "$WORK/b2" ${BARE_ARGS:-} \
    >"$OUT/b2.json" 2>"$OUT/b2.err"
echo "py-spy exited $?"
tail -25 "$OUT/b2.err"
gzip -f "$OUT/spy.txt"
ls -la "$OUT"
