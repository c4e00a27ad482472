#!/usr/bin/env bash
# dstui on real GPUs (issue 8), for a fresh lent accelerator machine (2 GPUs). One phase fits one
# 10-minute device command (docs/gpu-validation/README.md has the numbers these produced):
#
#   benchmarks/gpu/validate.sh batch   # configs/experiments/gpu_validation.yaml through `dstui run`,
#                                      # nvidia-smi sampled meanwhile, `dstui report`, MLflow store
#                                      # exported. 7 runs x ~85 s do not fit one command: run it again
#                                      # with RESUME=1 (`dstui run --resume`) to finish the batch,
#                                      # or ONLY="z3-dc" BASELINE=z3-dc for chosen conditions alone.
#   benchmarks/gpu/validate.sh mfu     # 1 GPU: bare PyTorch loop vs the runner (MFU), syncs, top ops
#   benchmarks/gpu/validate.sh watch   # 2 GPUs: cost of watching, dstui vs bare launcher, interleaved
#   benchmarks/gpu/validate.sh bench|all   # mfu+watch | batch+mfu+watch (more than one command)
#   benchmarks/gpu/validate.sh forecast    # issue 14 on 1 GPU: the held-out memory-forecast grid
#                                      # (benchmarks/gpu/forecast_holdout1.yaml), forecast_check.py
#   benchmarks/gpu/validate.sh profile     # issue 12: a condition (z1-dc) once, then its repeat with the
#                                      # rank under cProfile (benchmarks/gpu/profile_run.py)
#   benchmarks/gpu/validate.sh share       # issue 26 on 1 GPU: feasibility, two batches one after
#                                      # another on the one GPU, a fresh op build named while it runs
#   benchmarks/gpu/validate.sh turnaround  # issue 12 on 1 GPU: launch -> first step old vs new path
#                                      # (benchmarks/turnaround.py, interleaved), then a DeepCompile
#                                      # condition twice: first compile vs a repeat from the cache
#   benchmarks/gpu/validate.sh folders     # issue 31.3 on 1 GPU: config-only model folders (Qwen2-0.5B,
#                                      # GPT-2 medium shapes) x ZeRO 1, 3; an empty tokenizer refused
#   benchmarks/gpu/validate.sh sp          # issue 41 on 2 GPUs (~7 min): benchmarks/gpu/sp.yaml through
#                                      # `dstui run`: no-SP, Ulysses eager/compile/DeepCompile (+ DeepCompile
#                                      # without the check), ring, Ulysses ZeRO 2 and 3, four injected faults;
#                                      # the sp-check on each; then benchmarks/gpu/sp_table.py's table and
#                                      # the report's SP section. ONLY="eager dc dc-unchecked" runs those alone.
#   benchmarks/gpu/validate.sh sp4         # issue 41 on 4 GPUs (~6.5 min): benchmarks/gpu/sp4.yaml, sp 2 x dp 2
#   benchmarks/gpu/validate.sh tune        # issue 42 on 1 GPU (~9.5 min): llama-1b, ZeRO 1-3 x micro batch
#                                      # 1/2/4: the exhaustive grid (`dstui run` of the search's grid.yaml,
#                                      # a home of its own), `dstui tune` over the same space, then DeepSpeed's
#                                      # autotuner (mlflow hidden: it crashes with KeyError MLFLOW_RUN_ID
#                                      # otherwise) for AUTOTUNE_LIMIT s; benchmarks/gpu/tune_compare.py
#                                      # prints winner vs grid best, probes and GPU time, model errors.
#                                      # 2 GPUs: TUNE_SPEC=benchmarks/gpu/tune2.yaml CUDA_VISIBLE_DEVICES=0,1
#                                      # AUTOTUNE_GPUS=2
#   benchmarks/gpu/validate.sh autotune    # DeepSpeed's autotuner alone on tune1.yaml's space, given the
#                                      # whole command (its answer needs ~6 min on one GPU)
#   benchmarks/gpu/validate.sh bare        # issue 31 on 1 GPU: a bare DeepSpeed script vs `dstui run`
#                                      # (llama-1b, ZeRO-1, bf16, 4 x 2048, 10 steps), interleaved,
#                                      # BARE_ROUNDS (3) rounds after a warm-up (bare_vs_dstui.py);
#                                      # BEFORE_TREE=dir adds `dstui run` from an older tree
#                                      # (git archive OLD dstui runners configs pyproject.toml);
#                                      # prints dstui's own marks (DSTUI_TRACE: CLI, checks,
#                                      # supervisor, op check, launch, end) beside the rank's phases
#   benchmarks/gpu/validate.sh matrix      # issue 37 on 2 GPUs (~4 min): the equivalence matrix's bf16 and
#                                      # fp16 cells (configs/experiments/equivalence_matrix.yaml; grad_accum 4
#                                      # unless MATRIX_ONLY='...' names others), every verdict with its
#                                      # grad-norm ratio and shape, `dstui report`
#   benchmarks/gpu/validate.sh gap         # issue 37.7 on 2 GPUs (~5 min): seed 001's z1 vs z2+DeepCompile
#                                      # loss gap at step 10, z2 eager as the noise pair, 2 seeds
#                                      # (benchmarks/gpu/gap.yaml); benchmarks/gpu/loss_gap.py answers
#
# Packages the machine lacks (deepspeed, hjson, pydantic, mlflow-skinny and what its SQLite store
# imports) travel as wheels in .whl/ (see docs/gpu-validation/README.md for how they were made) and
# are installed with --target into $SITE; dstui itself runs from this checkout (PYTHONPATH).
# Everything that must come back is put under $OUT as a few archives (the device tool brings back at
# most 8 files, two folders deep).
set -u -o pipefail

PHASE=${1:-all}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
# shellcheck source=benchmarks/gpu/device_env.sh
. "$REPO/benchmarks/gpu/device_env.sh"
# Overridable so the script can be tried on a CPU box with a tiny model first.
VALIDATION_SPEC=${VALIDATION_SPEC:-configs/experiments/gpu_validation.yaml}
MFU_SPEC=${MFU_SPEC:-benchmarks/gpu/mfu.yaml}
WATCH_SPEC=${WATCH_SPEC:-benchmarks/gpu/watch.yaml}
BENCH_ARGS=${BENCH_ARGS:---model llama-1b --seq-length 2048 --micro-batch 8}

export DSTUI_HOME=$WORK/home
mkdir -p "$DSTUI_HOME"
T0=$(date +%s)
# Everything must be back under $OUT before the device command's 10-minute limit: phases shrink
# their longest part to what is left of DEADLINE_S (seconds after this script started).
DEADLINE_S=${DEADLINE_S:-585}
say() { echo "[validate $(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }

setup() {
    if [ -z "${DSTUI_GPU_NO_INSTALL:-}" ] && [ ! -f "$SITE/.dstui-installed" ]; then
        say "installing $(ls .whl/*.whl | wc -l) wheels into $SITE"
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
            || { say "wheel install failed"; return 1; }
        touch "$SITE/.dstui-installed"
    fi
    # mlflow's and opentelemetry's generated protobuf code needs a recent enough protobuf runtime
    if ! $PY -c "import mlflow.protos.service_pb2, opentelemetry.proto.trace.v1.trace_pb2" 2>/dev/null; then
        say "protobuf too old for mlflow: installing .whl/fallback/"
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/fallback/*.whl
    fi
    {
        echo "## date"; date -u
        echo "## nvidia-smi"; nvidia-smi
        echo "## nvidia-smi topo -m"; nvidia-smi topo -m
        echo "## nvidia-smi -q (clocks, power)"; nvidia-smi -q -d CLOCK,POWER | head -80
        echo "## nvcc"; nvcc --version 2>&1 | tail -2
        echo "## cpu / memory"; nproc; free -g
        echo "## python packages"
        $PY - <<'EOF'
import importlib.metadata as md, platform, sys
print("python", platform.python_version(), sys.executable)
for n in ["torch", "deepspeed", "transformers", "mlflow-skinny", "pydantic", "protobuf", "typing_extensions",
          "sqlalchemy", "numpy", "pandas", "matplotlib", "nvidia-ml-py", "triton", "ninja", "psutil"]:
    try:
        print(f"{n} {md.version(n)}")
    except md.PackageNotFoundError:
        print(f"{n} -")
import torch
print("torch.cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
import deepspeed, mlflow, dstui
print("imports ok:", deepspeed.__file__, mlflow.__version__, dstui.__file__)
EOF
    } >"$OUT/env-$PHASE.txt" 2>&1
    tail -8 "$OUT/env-$PHASE.txt"
    grep -q "imports ok" "$OUT/env-$PHASE.txt" || { say "imports failed"; return 1; }
}

prebuild() {
    # Build DeepSpeed's JIT ops (FusedAdam for every run, CPUAdam for offload, the DeepCompile op)
    # in parallel once, before anything is timed; each run then only loads them.
    say "building JIT ops in $TORCH_EXTENSIONS_DIR"
    local pids=()
    for b in ${PREBUILD_OPS:-FusedAdamBuilder CPUAdamBuilder dc.DeepCompileBuilder}; do
        (
            mod=deepspeed.ops.op_builder; cls=$b
            case $b in *.*) mod=$mod.${b%%.*}; cls=${b#*.};; esac
            MAX_JOBS=10 $PY -c "from $mod import $cls as B; import time; t=time.time(); B().load(); print('$cls built/loaded in %.1fs' % (time.time()-t))"
        ) >"$WORK/build-$b.log" 2>&1 &
        pids+=($!)
    done
    local ok=0
    for i in "${!pids[@]}"; do wait "${pids[$i]}" || ok=1; done
    for f in "$WORK"/build-*.log; do tail -1 "$f"; done
    [ $ok = 0 ] || { say "an op build failed:"; tail -30 "$WORK"/build-*.log; }
    return 0
}

start_smi() {  # $1 = csv
    $PY benchmarks/gpu/nvsmi_sample.py --out "$1" --apps "${1%.csv}-apps.csv" --interval 0.5 --seconds 900 &
    SMI_PID=$!
}
stop_smi() { kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; }

cancel_leftovers() {  # runs of a batch still going after a timeout must not disturb what follows
    local batch=$1
    for st in "$batch"/*/status.json; do
        if grep -qE '"state": "(running|starting|queued)"' "$st"; then
            $PY -m dstui cancel "$(dirname "$st")" || true
        fi
    done
    sleep 3
}

spec_name() { $PY -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$1"; }

phase_batch() {
    local limit=${BATCH_LIMIT:-$(( $(left) - 75 ))} name
    name=$(spec_name "$VALIDATION_SPEC")
    start_smi "$WORK/nvsmi-batch.csv"
    say "dstui run $VALIDATION_SPEC (limit ${limit}s)"
    # ONLY="z3-dc" runs just those conditions (dstui run --only); BASELINE names the report's baseline
    timeout "$limit" $PY -m dstui run "$VALIDATION_SPEC" ${RESUME:+--resume} ${ONLY:+--only $ONLY}
    say "dstui run exited $?"
    stop_smi
    local batch
    batch=$(ls -dt "$DSTUI_HOME/runs/$name"-* | head -1)
    cancel_leftovers "$batch"
    $PY -m dstui status "$(basename "$batch")" --no-takeover || true
    say "dstui report"
    timeout 120 $PY -m dstui report --experiment "$name" --batch "$(basename "$batch")" \
        --baseline "${BASELINE:-z0}" --tolerance 0.05 -o "$WORK/report" || say "report failed"
    $PY benchmarks/gpu/nvsmi_check.py --nvsmi "$WORK/nvsmi-batch.csv" --out "$WORK/nvsmi-check-batch.json" \
        "$batch"/*/system.jsonl || true
    echo "-- busy only:"
    $PY benchmarks/gpu/nvsmi_check.py --busy-only --nvsmi "$WORK/nvsmi-batch.csv" \
        --out "$WORK/nvsmi-check-batch-busy.json" "$batch"/*/system.jsonl || true
    $PY benchmarks/gpu/summarize.py "$batch" --baseline "${BASELINE:-z0}" --json "$WORK/summary-batch.json" | tee "$WORK/summary-batch.md"
    tar -C "$WORK" -czf "$OUT/report.tgz" report 2>/dev/null || true
    # the MLflow store (SQLite + artifacts), the run folders, the nvidia-smi samples and the checks
    tar -C "$WORK" -czf "$OUT/batch-data.tgz" home/mlruns "home/runs/$(basename "$batch")" nvsmi-batch.csv \
        nvsmi-batch-apps.csv nvsmi-check-batch.json nvsmi-check-batch-busy.json summary-batch.json summary-batch.md build-*.log 2>/dev/null || true
    ls -la "$OUT"
}

phase_mfu() {  # ~4.5 min: bare loop, the runner through dstui (1 GPU), syncs and top ops
    local b=$WORK/bench mb
    mkdir -p "$b"
    start_smi "$WORK/nvsmi-mfu.csv"
    bare() {  # $1 = master | autocast
        CUDA_VISIBLE_DEVICES=0 timeout 150 $PY benchmarks/gpu/bare_loop.py $BENCH_ARGS --steps 30 --warmup-steps 8 \
            --mode "$1" --out "$b/bare_loop.jsonl" --profile "$b/bare_${1}_top_ops.txt" | cut -c1-700
    }
    say "MFU: bare PyTorch loop (bf16 weights + fp32 master, like DeepSpeed) on GPU 0"
    bare master
    say "MFU: the runner through dstui run on GPU 0 ($MFU_SPEC)"
    CUDA_VISIBLE_DEVICES=0 timeout 180 $PY -m dstui run "$MFU_SPEC" --quiet
    mb=$(ls -dt "$DSTUI_HOME/runs/$(spec_name "$MFU_SPEC")"-* | head -1)
    cancel_leftovers "$mb"
    $PY benchmarks/gpu/summarize.py "$mb" | tee "$b/summary-mfu.md"
    say "syncs per step and top ops of the DeepSpeed engine (1 GPU, ZeRO-0)"
    CUDA_VISIBLE_DEVICES=0 timeout 150 $PY benchmarks/gpu/sync_profile.py $BENCH_ARGS --zero-stage 0 \
        --steps 8 --out "$b/sync_profile.jsonl" --tables "$b" 2>&1 | grep -v "^\[rank0\]:\[W" | tail -5
    if [ "$(left)" -gt 70 ]; then say "MFU: bare PyTorch loop, AMP autocast variant"; bare autocast; fi
    stop_smi
    tar -C "$WORK" -czf "$OUT/mfu-data.tgz" bench nvsmi-mfu.csv nvsmi-mfu-apps.csv "home/runs/$(basename "$mb")" 2>/dev/null || true
    ls -la "$OUT"
}

phase_watch() {  # ~7.5 min on 2 GPUs (each llama-1b run costs ~70 s, mostly start-up)
    local b=$WORK/bench wname wb
    mkdir -p "$b"
    wname=$(spec_name "$WATCH_SPEC")
    start_smi "$WORK/nvsmi-watch.csv"
    say "cost of watching: ${WATCH_ORDER:-WBBWWB} on 2 GPUs ($WATCH_SPEC)"
    timeout "$(( $(left) - 30 ))" $PY benchmarks/gpu/watch_cost.py --spec "$WATCH_SPEC" \
        --deadline "$(( T0 + DEADLINE_S - 45 ))" --out "$b/watch" --timeout 150 \
        --order "${WATCH_ORDER:-WBBWWB}"
    stop_smi
    for wb in $(ls -d "$DSTUI_HOME/runs/$wname"-* 2>/dev/null); do cancel_leftovers "$wb"; done
    $PY benchmarks/gpu/nvsmi_check.py --busy-only --nvsmi "$WORK/nvsmi-watch.csv" --out "$b/nvsmi-check-watch.json" \
        "$DSTUI_HOME/runs/$wname"-*/*/system.jsonl || true
    tar -C "$WORK" -czf "$OUT/watch-data.tgz" bench/watch bench/nvsmi-check-watch.json nvsmi-watch.csv \
        nvsmi-watch-apps.csv $(cd "$WORK" && ls -d "home/runs/$wname"-* 2>/dev/null) 2>/dev/null || true
    ls -la "$OUT"
}

phase_turnaround() {  # ~6 min on 1 GPU (llama-1b): issue 12's GPU goals
    local b=$WORK/bench spec=${TURN_SPEC:-benchmarks/gpu/turnaround1.yaml} name tb
    mkdir -p "$b"
    name=$(spec_name "$spec")
    start_smi "$WORK/nvsmi-turn.csv"
    say "turnaround: old vs new path, ${TURN_ROUNDS:-2} rounds, --only ${TURN_EAGER:-z1} ($spec)"
    [ -n "${SKIP_TURN:-}" ] || timeout "$(( $(left) - 200 ))" $PY benchmarks/turnaround.py --spec "$spec" --only ${TURN_EAGER:-z1} \
        --rounds "${TURN_ROUNDS:-2}" --paths ${TURN_PATHS:-old new} ${TURN_WARMUP:+--warmup} \
        >"$b/turnaround.json" 2>"$b/turnaround.err"
    say "turnaround.py exited $?"; tail -8 "$b/turnaround.err"; head -c 1500 "$b/turnaround.json" | head -8
    for i in $(seq 1 "${TURN_DC_RUNS:-2}"); do  # the same DSTUI_HOME: the repeat finds the first run's compile cache
        say "compile cache: ${TURN_DC:-z1-dc} run $i"
        timeout "$(( $(left) - 40 ))" $PY -m dstui run "$spec" --only ${TURN_DC:-z1-dc} --quiet
        say "run $i exited $?"
    done
    stop_smi
    for tb in $(ls -d "$DSTUI_HOME/runs/$name"-* 2>/dev/null); do cancel_leftovers "$tb"; done
    $PY -m dstui status -n 2 --no-takeover 2>&1 | tail -20 | tee "$b/turn-status.txt" || true
    $PY benchmarks/gpu/nvsmi_check.py --nvsmi "$WORK/nvsmi-turn.csv" --out "$b/nvsmi-check-turn.json" \
        "$DSTUI_HOME/runs/$name"-*/*/system.jsonl || true
    du -sh "$DSTUI_HOME"/cache/compile_cache 2>/dev/null || find "$DSTUI_HOME" -maxdepth 3 -name compile_cache
    tar -C "$WORK" -czf "$OUT/turn-data.tgz" bench nvsmi-turn.csv nvsmi-turn-apps.csv \
        $(cd "$WORK" && ls -d "home/runs/$name"-* 2>/dev/null) 2>/dev/null || true
    ls -la "$OUT"
}

phase_bare() {  # ~5 min on 1 GPU (llama-1b): issue 31's start-up goals, bare script vs dstui run
    local b=$WORK/bench
    mkdir -p "$b"
    say "bare DeepSpeed script vs dstui run: ${BARE_ROUNDS:-3} rounds + warm-up (${BARE_ARGS:-llama-1b ZeRO-1 bf16 4 x 2048, 10 steps})"
    CUDA_VISIBLE_DEVICES=0 timeout "$(( $(left) - 25 ))" $PY benchmarks/gpu/bare_vs_dstui.py --rounds "${BARE_ROUNDS:-3}" \
        --warmup --deadline "$(( T0 + DEADLINE_S - 40 ))" --timeout 200 --work "$b/bare" ${BARE_ARGS:-} \
        ${BEFORE_TREE:+--before-tree "$BEFORE_TREE"} \
        >"$b/bare_vs_dstui.json" 2>"$b/bare_vs_dstui.err"
    say "bare_vs_dstui.py exited $?"; cat "$b/bare_vs_dstui.err"
    cp "$b/bare_vs_dstui.json" "$b/bare_vs_dstui.err" "$OUT/" 2>/dev/null
    tar -C "$WORK" -czf "$OUT/bare-data.tgz" --exclude='bench/bare/pycache' --exclude='bench/bare/torch_extensions' \
        bench/bare 2>/dev/null || true
    ls -la "$OUT"
}

phase_tune() {  # issue 42 on 1 GPU: grid vs dstui tune vs DeepSpeed's autotuner (TUNE_SPEC, ~7.5 min on llama-1b)
    local spec=${TUNE_SPEC:-benchmarks/gpu/tune1.yaml} b=$WORK/bench/tune grid gb t
    mkdir -p "$b"
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    # the search and the grid each in a home (and MLflow store) of its own: the search never learns from the grid
    DSTUI_HOME=$WORK/tune-home $PY -m dstui tune "$spec" --dry-run --json >"$b/plan-before.json" 2>"$b/plan.err" \
        || { say "tune --dry-run failed"; tail -5 "$b/plan.err"; return 1; }
    grid=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['grid_spec'])" "$b/plan-before.json")
    say "the exhaustive grid: dstui run $grid (limit ${GRID_LIMIT:-240}s)"
    t=$(date +%s)
    DSTUI_HOME=$WORK/grid-home timeout "${GRID_LIMIT:-240}" $PY -m dstui run "$grid" --json >"$b/grid.json" 2>"$b/grid.err"
    say "grid exited $? after $(( $(date +%s) - t ))s"
    gb=$(ls -dt "$WORK"/grid-home/runs/*-grid-* | head -1)
    cancel_leftovers "$gb"
    say "dstui tune $spec (limit ${TUNE_LIMIT:-150}s)"
    t=$(date +%s)
    DSTUI_HOME=$WORK/tune-home timeout "${TUNE_LIMIT:-150}" $PY -m dstui tune "$spec" --json >"$b/tune.json" 2>"$b/tune.err"
    say "tune exited $? after $(( $(date +%s) - t ))s"; tail -4 "$b/tune.err"
    DSTUI_HOME=$WORK/tune-home $PY -m dstui tune "$spec" --dry-run --json >"$b/plan-after.json" 2>>"$b/plan.err"
    # the autotuner gets what is left of the command but the comparison's and the archive's 30 s
    AUTOTUNE_LIMIT=${AUTOTUNE_LIMIT:-$(( $(left) > 90 ? $(left) - 30 : 60 ))} autotune "$b"
    $PY benchmarks/gpu/tune_compare.py --grid-batch "$gb" --tune "$b/tune.json" --before "$b/plan-before.json" \
        --after "$b/plan-after.json" --autotune-dir "$WORK/autotune" \
        --autotune-wall "$(cat "$b/autotune-wall" 2>/dev/null || echo 0)" --json "$b/compare.json" | tee "$b/compare.md"
    tar -C "$WORK" -czf "$OUT/tune-data.tgz" bench/tune tune-home/runs grid-home/runs autotune/autotuning_results \
        2>/dev/null || true
    ls -la "$OUT"
}

autotune() {  # $1 = output folder: DeepSpeed's autotuner on the same model and space, AUTOTUNE_LIMIT seconds
    local b=$1 at=$WORK/autotune t
    [ -n "$b" ] && [ -n "$WORK" ] || return 1
    rm -rf "$at"; mkdir -p "$at/no-mlflow/mlflow" "$at/bin"
    # its mlflow support reads os.environ['MLFLOW_RUN_ID'] whenever mlflow imports: hide mlflow from it
    echo 'raise ImportError("hidden from the autotuner: it needs MLFLOW_RUN_ID set when mlflow imports")' \
        >"$at/no-mlflow/mlflow/__init__.py"
    # its experiments start `deepspeed` from PATH: the launcher of this Python
    printf '#!/bin/sh\nexec %s -c "import sys; from deepspeed.launcher.runner import main; sys.exit(main())" "$@"\n' \
        "$PY" >"$at/bin/deepspeed"
    chmod +x "$at/bin/deepspeed"
    printf '%s\n' "{\"train_micro_batch_size_per_gpu\": [1, 2, 4], \"gradient_accumulation_steps\": 2,
 \"bf16\": {\"enabled\": ${AUTOTUNE_BF16:-true}}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}},
 \"zero_optimization\": {\"stage\": [1, 2, 3]},
 \"autotuning\": {\"enabled\": true, \"fast\": true, \"overwrite\": true, \"metric\": \"throughput\",
                \"start_profile_step\": 3, \"end_profile_step\": 5,
                \"results_dir\": \"$at/autotuning_results\", \"exps_dir\": \"$at/autotuning_exps\"}}" >"$at/ds_config.json"
    say "DeepSpeed's autotuner (limit ${AUTOTUNE_LIMIT:-130}s), mlflow hidden"
    t=$(date +%s)
    # timeout signals its whole process group (the experiments' launchers and ranks too); KILL 10 s later
    (cd "$at" && PATH="$at/bin:$PATH" PYTHONPATH="$at/no-mlflow:${PYTHONPATH:-}" timeout --kill-after=10 "${AUTOTUNE_LIMIT:-130}" \
        "$at/bin/deepspeed" --autotuning run --num_gpus "${AUTOTUNE_GPUS:-1}" "$REPO/benchmarks/gpu/autotune_bare.py" \
        --model-config "$REPO/${AUTOTUNE_MODEL:-configs/models/llama-1b.json}" --seq-length "${AUTOTUNE_SEQ:-2048}" \
        --deepspeed_config "$at/ds_config.json") >"$b/autotune.log" 2>&1
    say "autotuner exited $? after $(( $(date +%s) - t ))s"
    echo $(( $(date +%s) - t )) >"$b/autotune-wall"
    grep -E "optimal|Tuning completed|num_experiments|Error" "$b/autotune.log" | tail -8
}

phase_autotune() {  # DeepSpeed's autotuner alone, to its answer: what is left of the command but 20 s
    local b=$WORK/bench/autotune
    mkdir -p "$b"
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    AUTOTUNE_LIMIT=${AUTOTUNE_LIMIT:-$(( $(left) - 20 ))} autotune "$b"
    ls "$WORK/autotune/autotuning_results"; cat "$WORK/autotune/autotuning_results/"*summary* 2>/dev/null | head -20
    tar -C "$WORK" -czf "$OUT/autotune-data.tgz" bench/autotune autotune/autotuning_results 2>/dev/null || true
}

phase_folders() {  # ~3 min on 1 GPU: issue 31.3, local model folders as users make them (model_folders.py)
    local b
    $PY benchmarks/gpu/model_folders.py prepare "$WORK"
    say "a folder whose tokenizer yields no token: refused before launch"
    $PY -m dstui run "$WORK/folders-refused.yaml" >"$OUT/folders-refused.txt" 2>&1
    echo "exit $?" >>"$OUT/folders-refused.txt"
    cat "$OUT/folders-refused.txt"
    say "config-only folders (Qwen2-0.5B and GPT-2 medium shapes) x ZeRO 1, 3 through dstui run"
    timeout "$(( $(left) - 30 ))" $PY -m dstui run "$WORK/folders.yaml" >"$OUT/folders-run.txt" 2>&1
    echo "exit $?" >>"$OUT/folders-run.txt"
    tail -15 "$OUT/folders-run.txt"
    b=$(ls -dt "$DSTUI_HOME"/runs/folders-2* 2>/dev/null | head -1)
    [ -n "$b" ] || { say "no batch laid out"; return 0; }
    cancel_leftovers "$b"
    $PY benchmarks/gpu/model_folders.py summarize "$b" | tee "$OUT/folders-summary.txt"
    tar -C "$WORK" -czf "$OUT/folders-data.tgz" "home/runs/$(basename "$b")" 2>/dev/null || true
}

phase_forecast() {  # ~7 min on 1 GPU: the held-out memory-forecast grid (issue 14), then the check
    local spec=${FORECAST_SPEC:-benchmarks/gpu/forecast_holdout1.yaml} name fb gib
    name=$(spec_name "$spec")
    gib=$($PY -c "import torch; print(round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))")
    say "forecast grid $spec on a ${gib}-GiB GPU (limit $(( $(left) - 60 ))s)"
    timeout "$(( $(left) - 60 ))" $PY -m dstui run "$spec" --quiet ${ONLY:+--only $ONLY}
    say "dstui run exited $?"
    fb=$(ls -dt "$DSTUI_HOME/runs/$name"-* | head -1)
    cancel_leftovers "$fb"
    $PY -m dstui status "$(basename "$fb")" --no-takeover 2>&1 | tail -25 || true
    $PY benchmarks/gpu/forecast_check.py "$fb/" --gpu-mem-gib "$gib" --json "$WORK/forecast_check.json" \
        | tee "$WORK/forecast_check.md" || true
    tar -C "$WORK" -czf "$OUT/forecast-data.tgz" forecast_check.json forecast_check.md \
        "home/runs/$(basename "$fb")" build-*.log 2>/dev/null || true
    # where a llama-1b run's start-up goes (issue 12): its command again, the rank under cProfile
    profile_one "$fb/${PROFILE_RUN:-l1b-z1-mb2-r0}"
    ls -la "$OUT"
}

profile_one() {  # $1 = a finished 1-rank run folder: replayed (2 steps) with the rank under cProfile
    [ "$(left)" -gt 90 ] && [ -d "$1" ] || { say "no time or no run folder to profile ($1)"; return 0; }
    say "profiling $(basename "$1") again under cProfile"
    timeout "$(( $(left) - 20 ))" $PY benchmarks/gpu/profile_run.py "$1" --out "$WORK/prof" --steps 2 --top 60 \
        >"$WORK/prof.txt" 2>&1
    grep -E "^phases|function calls" "$WORK/prof.txt"
    tar -C "$WORK" -czf "$OUT/prof.tgz" prof prof.txt 2>/dev/null || true
}

phase_profile() {  # a condition once (fills the compile caches), then its repeat under cProfile (issue 12)
    local spec=${PROFILE_SPEC:-benchmarks/gpu/turnaround1.yaml} only=${PROFILE_ONLY:-z1-dc} name pb
    name=$(spec_name "$spec")
    say "$spec --only $only, then the repeat under cProfile"
    timeout "$(( $(left) - 200 ))" $PY -m dstui run "$spec" --quiet --only "$only"
    say "dstui run exited $?"
    pb=$(ls -dt "$DSTUI_HOME/runs/$name"-* | head -1)
    cancel_leftovers "$pb"
    profile_one "$pb/$only-r0"
    ls -la "$OUT"
}

phase_sp() {  # issue 41: a sequence-parallel spec through dstui run, its table and the report's SP section
    local spec=${SP_SPEC:-benchmarks/gpu/sp.yaml} name sb
    name=$(spec_name "$spec")
    start_smi "$WORK/nvsmi-$name.csv"
    say "dstui run $spec (limit $(( $(left) - 50 ))s)"
    timeout "$(( $(left) - 50 ))" $PY -m dstui run "$spec" --quiet ${ONLY:+--only $ONLY} ${RESUME:+--resume}
    say "dstui run exited $? (1 when a run FAILed: the injected faults must)"
    stop_smi
    sb=$(ls -dt "$DSTUI_HOME/runs/$name"-* 2>/dev/null | head -1)
    [ -n "$sb" ] || { say "no batch laid out"; return 0; }
    cancel_leftovers "$sb"
    $PY benchmarks/gpu/sp_table.py "$sb" --json "$WORK/sp-table-$name.json" | tee "$WORK/sp-table-$name.md"
    timeout 90 $PY -m dstui report --experiment "$name" --batch "$(basename "$sb")" -o "$WORK/report-$name" \
        || say "report failed"
    sed -n '/^## Sequence parallelism/,/^## /p' "$WORK/report-$name/report.md" 2>/dev/null | head -30
    tar -C "$WORK" -czf "$OUT/$name-data.tgz" "report-$name" "sp-table-$name.md" "sp-table-$name.json" \
        "nvsmi-$name.csv" "home/runs/$(basename "$sb")" build-*.log 2>/dev/null || true
    ls -la "$OUT"
}

phase_share() {  # issue 26 on 1 GPU: feasibility, two batches one after another, a named op build
    say "feasibility on this machine (dstui run --dry-run)"
    $PY -m dstui run benchmarks/gpu/feasible1.yaml --dry-run > "$OUT/share-feasible.txt" 2>&1
    echo "exit $?" >> "$OUT/share-feasible.txt"
    say "two batches of 1-GPU runs, started one right after the other"
    $PY -m dstui run benchmarks/gpu/share1.yaml --detach > "$OUT/share-first.txt" 2>&1
    sleep 1
    $PY -m dstui run benchmarks/gpu/share1.yaml > "$OUT/share-second.txt" 2>&1
    for b in $(ls -dt "$DSTUI_HOME"/runs/share-* | head -2); do
        for i in $(seq 1 120); do [ "$($PY -c "import json,sys; print(json.load(open(sys.argv[1])).get('finalized'))" "$b/batch.json")" = True ] && break; sleep 1; done
    done
    $PY - "$DSTUI_HOME/runs" > "$OUT/share-intervals.txt" <<'PYEOF'
import json, sys, pathlib
rows = []
for st in sorted(pathlib.Path(sys.argv[1]).glob("share-*/*/status.json")):
    s = json.loads(st.read_text())
    ex = json.loads((st.parent / "exit.json").read_text()) if (st.parent / "exit.json").exists() else {}
    rows.append((s.get("started"), st.parent.parent.name, s["name"], s.get("state"), s.get("gpu_slice"), ex.get("ended")))
rows.sort(key=lambda r: r[0] or 0)
t0 = rows[0][0]
for started, batch, name, state, gpus, ended in rows:
    print(f"{batch} {name} {state} gpus={gpus} start=+{started - t0:.1f}s end=+{(ended or 0) - t0:.1f}s")
clash = [(a[1], a[2], b[1], b[2]) for a in rows for b in rows
         if a[1] != b[1] and a[0] < (b[5] or 0) and b[0] < (a[5] or 0)]
print("overlapping runs of different batches:", clash or "none")
PYEOF
    cat "$OUT/share-intervals.txt"
    say "a fresh op cache: the first run names the FusedAdam build while it happens"
    TORCH_EXTENSIONS_DIR=$WORK/fresh_ext timeout "$(( $(left) - 20 ))" $PY -m dstui run benchmarks/gpu/opbuild1.yaml > "$OUT/share-opbuild.txt" 2>&1
    echo "exit $?" >> "$OUT/share-opbuild.txt"
    tail -20 "$OUT/share-opbuild.txt"
}

phase_matrix() {  # issue 37: the equivalence matrix's half-precision cells on 2 GPUs
    local spec=$WORK/matrix-gpu.yaml mb only=${MATRIX_ONLY:-'*-ga4-*'}
    $PY - "$spec" <<'PYEOF'
import sys, yaml
d = yaml.safe_load(open("configs/experiments/equivalence_matrix.yaml"))
d["name"] = "matrix-gpu"
d["axes"].update(gpus=[2], dtype=["bf16", "fp16"])
d["exclude"] = [x for x in d["exclude"] if x.get("gpus") != 1]
# fp16 starts at a loss scale of 2^8, not 2^16: a tiny model's first steps would all overflow and be skipped
d["settings"]["ds_overrides"] = {"fp16": {"initial_scale_power": 8}}
d["conditions"] = [{**c, "name": c["name"].replace("fp32", dt), "dtype": dt} for c in d["conditions"]
                   if c["gpus"] == 2 and c["dtype"] == "fp32" for dt in ("bf16", "fp16")]
yaml.safe_dump(d, open(sys.argv[1], "w"), sort_keys=False)
PYEOF
    say "equivalence matrix, bf16 + fp16 on 2 GPUs, --only $only (limit $(( $(left) - 60 ))s)"
    set -f  # the patterns go to dstui as they are
    timeout "$(( $(left) - 60 ))" $PY -m dstui run "$spec" --quiet --only $only
    say "dstui run exited $?"
    set +f
    mb=$(ls -dt "$DSTUI_HOME"/runs/matrix-gpu-* | head -1)
    cancel_leftovers "$mb"
    COLUMNS=200 $PY -m dstui status "$(basename "$mb")" -v --no-takeover 2>&1 | tee "$OUT/matrix-status.txt" || true
    timeout 60 $PY -m dstui report --experiment matrix-gpu --batch "$(basename "$mb")" -o "$WORK/matrix-report" \
        || say "report failed"
    tar -C "$WORK" -czf "$OUT/matrix-data.tgz" matrix-report "home/runs/$(basename "$mb")" 2>/dev/null || true
    ls -la "$OUT"
}

phase_gap() {  # issue 37.7: is seed 001's z1 vs z2+DeepCompile loss gap at step 10 noise or a defect?
    local spec=${GAP_SPEC:-benchmarks/gpu/gap.yaml} gb
    say "$spec: z1, z2, z2-dc x 2 seeds (limit $(( $(left) - 30 ))s)"
    timeout "$(( $(left) - 30 ))" $PY -m dstui run "$spec" --quiet
    say "dstui run exited $?"
    gb=$(ls -dt "$DSTUI_HOME/runs/$(spec_name "$spec")"-* | head -1)
    cancel_leftovers "$gb"
    $PY benchmarks/gpu/loss_gap.py "$gb" --pair z1 z2-dc --noise z1 z2 --step "${GAP_STEP:-10}" \
        --json "$OUT/gap.json" | tee "$OUT/gap.md"
    $PY benchmarks/gpu/summarize.py "$gb" --baseline seed42-z1 | tee "$OUT/gap-summary.md"
    tar -C "$WORK" -czf "$OUT/gap-data.tgz" "home/runs/$(basename "$gb")" 2>/dev/null || true
}

setup || exit 1
# the benchmarks need FusedAdam only (ZeRO-0/1, no offload, no DeepCompile)
case $PHASE in bare|folders) PREBUILD_OPS=${PREBUILD_OPS:-FusedAdamBuilder};; esac
case $PHASE in turnaround) PREBUILD_OPS=${PREBUILD_OPS:-FusedAdamBuilder dc.DeepCompileBuilder};; esac
case $PHASE in profile) PREBUILD_OPS=${PREBUILD_OPS:-FusedAdamBuilder dc.DeepCompileBuilder};; esac
case $PHASE in forecast) PREBUILD_OPS=${PREBUILD_OPS:-FusedAdamBuilder CPUAdamBuilder dc.DeepCompileBuilder};; esac
case $PHASE in tune|autotune) PREBUILD_OPS=${PREBUILD_OPS:-FusedAdamBuilder};; esac
case $PHASE in mfu|watch|bench) PREBUILD_OPS=${PREBUILD_OPS:-FusedAdamBuilder};; esac
# the SP specs train with torch's AdamW: only DeepCompile's op is built
case $PHASE in sp|sp4) PREBUILD_OPS=${PREBUILD_OPS:-dc.DeepCompileBuilder};; esac
case $PHASE in matrix) SKIP_PREBUILD=${SKIP_PREBUILD:-1};; esac   # torch AdamW: no JIT op to build
case $PHASE in gap) PREBUILD_OPS=${PREBUILD_OPS:-FusedAdamBuilder dc.DeepCompileBuilder};; esac
[ -n "${SKIP_PREBUILD:-}" ] || prebuild
case $PHASE in
    batch) phase_batch ;;
    mfu) phase_mfu ;;
    watch) phase_watch ;;
    turnaround) phase_turnaround ;;
    bare) phase_bare ;;
    folders) phase_folders ;;
    tune) phase_tune ;;
    autotune) phase_autotune ;;
    forecast) phase_forecast ;;
    profile) phase_profile ;;
    bench) phase_mfu; phase_watch ;;
    all) phase_batch; phase_mfu; phase_watch ;;
    share) phase_share ;;
    sp) phase_sp ;;
    sp4) SP_SPEC=${SP_SPEC:-benchmarks/gpu/sp4.yaml} phase_sp ;;
    matrix) phase_matrix ;;
    gap) phase_gap ;;
    setup) ;;
    *) echo "usage: $0 batch|mfu|watch|turnaround|bare|forecast|profile|share|sp|sp4|matrix|gap|tune|autotune|bench|all|setup" >&2; exit 2 ;;
esac
say "done ($PHASE)"
