# Sourced by the device scripts (validate.sh, diag_startup.sh, diag_rank.sh): the folders and the
# environment every run on a lent accelerator machine gets. Expects REPO (the checkout); sets PY,
# OUT, WORK, SITE and exports what the runs need. DSTUI_HOME is the caller's to choose.
PY=${PYTHON:-python3}
OUT=${OUT:-$REPO/gpu-out}
WORK=${DSTUI_GPU_WORK:-/tmp/dstui-gpu}
SITE=${DSTUI_GPU_SITE:-/tmp/site}
mkdir -p "$OUT" "$WORK"
# NVLink multicast stays off on shared hosts (the lent machines' rule; harmless elsewhere).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The image sets 9.0a, which DeepSpeed's JIT op builder cannot parse ("invalid literal for int()").
export TORCH_CUDA_ARCH_LIST=9.0
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false
export TORCH_EXTENSIONS_DIR=$WORK/torch_extensions   # JIT ops built once, shared by every run
export PYTHONPATH=$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}

# The diagnosis scripts' start (diag_*.sh): the wheels installed and FusedAdam built by
# validate.sh's setup, or the script stops showing setup's last lines; then everything on GPU 0.
diag_setup() {
    PREBUILD_OPS=FusedAdamBuilder bash "$REPO/benchmarks/gpu/validate.sh" setup >"$OUT/diag-setup.txt" 2>&1 \
        || { tail -30 "$OUT/diag-setup.txt"; exit 1; }
    export CUDA_VISIBLE_DEVICES=0
}
# py-spy from the wheel that travels in .whl/tools; its binary is then $PYSPY.
PYSPY=/tmp/pyspy/bin/py-spy
install_pyspy() {
    $PY -m pip install -q --no-index --no-deps --target /tmp/pyspy "$REPO"/.whl/tools/py_spy*.whl 2>&1 | tail -1
}
