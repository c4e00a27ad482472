#!/usr/bin/env bash
# One device call on a 4-GPU machine (nvidia-h100-x4), 30 minutes of device time being scarce:
#   1. setup once (wheels, the FusedAdam and DeepCompile JIT ops);
#   2. two 2-GPU batches side by side, which dstui's GPU ledger must place on disjoint GPUs:
#        (a) `validate.sh gap`: seed 001's z1 vs z2+DeepCompile loss gap with repeats (issue 37.7);
#        (b) `validate.sh sp` on $SP_ONLY (DeepCompile under Ulysses with the sp-check: issue 41), then the
#            equivalence matrix's pipeline cells (`validate.sh matrix`, MATRIX_ONLY='*pp2*': issue 37.4);
#   3. `validate.sh sp4`: sp 2 x dp 2 on all four GPUs (issue 41).
# Each part gets a deadline of its own so that everything is under $OUT before the call's limit.
#   DEADLINE_S=585 bash benchmarks/gpu/four_gpus.sh
set -u
cd "$(dirname "$0")/../.."
T0=$(date +%s)
TOTAL=${DEADLINE_S:-585}
PAIR_END=${PAIR_END:-380}   # seconds after T0 by which the two 2-GPU parts must be done
OUT=${OUT:?OUT must be set}
left_until() { echo $(( $1 - ($(date +%s) - T0) )); }
say() { echo "[four_gpus $(( $(date +%s) - T0 ))s] $*"; }

PREBUILD_OPS="FusedAdamBuilder dc.DeepCompileBuilder" DEADLINE_S=150 bash benchmarks/gpu/validate.sh setup \
    > "$OUT/setup.log" 2>&1
say "setup exited $? ($(tail -3 "$OUT/setup.log" | tr '\n' ' '))"
nvidia-smi -L | tee "$OUT/gpus.txt"

say "two 2-GPU batches side by side (until ${PAIR_END}s)"
( SKIP_PREBUILD=1 DEADLINE_S=$(left_until "$PAIR_END") bash benchmarks/gpu/validate.sh gap > "$OUT/gap.log" 2>&1
  echo "gap exited $?" >> "$OUT/gap.log" ) &
GAP=$!
sleep 5  # the gap batch claims its GPUs first: the other must be placed beside it, not on them
( SKIP_PREBUILD=1 ONLY="${SP_ONLY:-nosp dc dc-unchecked dc-head-split}" DEADLINE_S=$(( $(left_until "$PAIR_END") - 100 )) \
      bash benchmarks/gpu/validate.sh sp > "$OUT/sp.log" 2>&1
  echo "sp exited $?" >> "$OUT/sp.log"
  SKIP_PREBUILD=1 MATRIX_ONLY='*pp2*' DEADLINE_S=$(left_until "$PAIR_END") \
      bash benchmarks/gpu/validate.sh matrix > "$OUT/matrix-pp2.log" 2>&1
  echo "matrix exited $?" >> "$OUT/matrix-pp2.log" ) &
SP=$!
# which GPUs each batch's runs were given, as the ledger saw it, every 10 s
( while kill -0 "$GAP" 2>/dev/null || kill -0 "$SP" 2>/dev/null; do
      date +%s; nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader; sleep 10
  done > "$OUT/gpu-apps.txt" 2>&1 ) &
wait "$GAP" "$SP"
say "pair done: $(tail -1 "$OUT/gap.log"); $(tail -1 "$OUT/sp.log"); $(tail -1 "$OUT/matrix-pp2.log")"

say "sp 2 x dp 2 on four GPUs (limit $(left_until "$TOTAL")s)"
SKIP_PREBUILD=1 ONLY="${SP4_ONLY:-nosp eager ring dc shard-offset}" DEADLINE_S=$(left_until "$TOTAL") bash benchmarks/gpu/validate.sh sp4 > "$OUT/sp4.log" 2>&1
say "sp4 exited $?"
for f in gap sp matrix-pp2 sp4; do echo "=== $f"; grep -v '^\s*$' "$OUT/$f.log" | tail -25; done
