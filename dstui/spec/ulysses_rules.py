"""Conditions the bundled runner cannot run with Ulysses sequence parallelism, refused before launch.

DeepCompile with a sequence-parallel group crashes on stock DeepSpeed (seen on
2xH200 with DeepSpeed 0.19.8: rank 1 SIGSEGV before step 1). The cause, read
in DeepSpeed's source: with Ulysses, ``deepspeed.initialize`` gets the
sequence-parallel ``mpu`` (``parallel_state_sp``, which has
``initialize_sequence_parallel``), and ``deepspeed.utils.groups._get_data_parallel_group``
then returns ``None`` for such an mpu; the engine stores that as
``data_parallel_group``. ``engine.compile()`` with DeepCompile calls
``init_z1_and_2`` (or ``init_z3``) -> ``engine._initialize_deepcompile_native``,
which hands ``self.data_parallel_group`` (None) to the 'dc' op's C++ ``init``;
that calls ``process_group->broadcast(...)`` on a null pointer. DeepCompile's
passes also have no all-to-all for the Ulysses attention (seed 003's modified
DeepSpeed inserted one in a compiler pass). Until a DeepSpeed release passes
the sequence-data-parallel group there and handles the all-to-all, the
condition is refused here with that reason.
"""

from __future__ import annotations

from typing import Any

DEEPCOMPILE_WITH_SP = (
    "DeepCompile with sequence_parallel > 1 crashes on stock DeepSpeed (checked up to 0.19.8): "
    "with the Ulysses mpu, groups._get_data_parallel_group() returns None and "
    "engine._initialize_deepcompile_native passes it to the 'dc' op's init "
    "(SIGSEGV in process_group->broadcast); use sp_mode eager or compile"
)


def refusal(settings: Any) -> tuple[str, str] | None:
    """(field, reason) when the runner cannot run this condition with sequence parallelism."""
    if settings.kind != "train" or settings.sequence_parallel <= 1:
        return None
    if settings.sp_mode == "deepcompile":
        return "sp_mode", DEEPCOMPILE_WITH_SP
    if settings.deepcompile:
        return "deepcompile", DEEPCOMPILE_WITH_SP
    return None
