"""Sequence-parallel conditions the bundled runner cannot run, refused before launch (Ulysses and ring).

DeepCompile with Ulysses is no longer refused. It crashed on stock DeepSpeed (0.19.8,
2xH100/H200: SIGSEGV in ``_initialize_deepcompile_native``) because under the Ulysses
``mpu`` ``deepspeed.utils.groups._get_data_parallel_group()`` returns None, the engine
stores that as its ``data_parallel_group``, and the 'dc' op's native init dereferences it.
The runner now hands DeepCompile the sequence-data-parallel group ZeRO reduces over
(runners/trainer.py), and the sp-check builds its no-SP engines after resetting the global
mpu the SP engine left (runners/sp_check.py). Whether the compiled graph is right is the
sp-check's verdict, not a rule here. On a machine without a GPU DeepCompile is refused by
the feasibility check (dstui/execute/feasibility.py: its op is built against CUDA).

What stays refused: ring attention compiled (the runner calls PyTorch's ring eagerly from
the attention slot, runners/ring.py) and a sequence the ring cannot split into 2 x
sequence_parallel equal chunks (causal load balancing).
"""

from __future__ import annotations

from typing import Any


def refusal(settings: Any) -> tuple[str, str] | None:
    """(field, reason) when the runner cannot run this condition with sequence parallelism."""
    if settings.kind != "train" or settings.sequence_parallel <= 1 or settings.sp_mode != "ring":
        return None
    for field in ("compile", "deepcompile"):
        if getattr(settings, field):
            return field, f"sp_mode ring runs eager (PyTorch's ring attention, called eagerly); drop {field}: true"
    sp = settings.sequence_parallel
    if settings.seq_length % (2 * sp):
        return "seq_length", (
            f"sp_mode ring splits the sequence into 2 x sequence_parallel = {2 * sp} equal chunks "
            f"(causal load balancing): seq_length {settings.seq_length} is not a multiple of {2 * sp}"
        )
    return None
