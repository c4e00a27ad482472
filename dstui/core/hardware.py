"""What a GPU can do, from the vendors' data sheets, and what a training step asks of it.

The runners report MFU against these peaks, and the time model
(:mod:`dstui.analysis.time_model`) starts from them before anything was measured:
one table for both, so a run's MFU and the tuner's prediction speak of the same peak.
Pure python (runners import it inside the job).
"""

from __future__ import annotations

# Dense (no sparsity) peak TFLOP/s per GPU by dtype, from the vendors' data
# sheets. Matched by substring of torch.cuda.get_device_name(), most specific
# first; "H100 PCIe" must win over "H100". Unknown GPUs and CPUs give None, and
# then no MFU is reported rather than a made-up one.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "fp32": 51.0}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "fp32": 60.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("H800", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("GH200", {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0}),
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "fp32": 80.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("A800", {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}),
    ("A40", {"bf16": 149.7, "fp16": 149.7, "fp32": 37.4}),
    ("A10G", {"bf16": 70.0, "fp16": 70.0, "fp32": 31.2}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2}),
    ("L40S", {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6}),
    ("L40", {"bf16": 181.0, "fp16": 181.0, "fp32": 90.5}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "fp32": 30.3}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("MI300X", {"bf16": 1307.0, "fp16": 1307.0, "fp32": 163.4}),
    ("MI250X", {"bf16": 383.0, "fp16": 383.0, "fp32": 47.9}),
]


def peak_tflops(gpu_name: str | None, dtype: str) -> float | None:
    """The data sheet's dense peak of this GPU in this dtype; None for a CPU or an unknown GPU."""
    if not gpu_name:
        return None
    for key, table in PEAK_TFLOPS:
        if key.lower() in gpu_name.lower():
            return table.get(dtype)
    return None


def flops_per_token(params: int, layers: int, hidden: int, seq_length: int) -> float:
    """Training FLOPs per token: 6*N + 12*L*H*S.

    6*N is forward (2N) plus backward (4N) for the dense weights (Kaplan et al.
    2020); 12*L*H*S is the attention score/value matmuls, forward and backward
    (PaLM appendix B). Recomputation by activation checkpointing is not
    counted, so MFU stays comparable across conditions.
    """
    return 6.0 * params + 12.0 * layers * hidden * seq_length
