"""DeepSpeed's CPU shared-memory all-reduce op: when a run needs it, and its buffers' clean-up.

DeepSpeed's torch backend builds the ``ShareMemComm`` op whenever a process group
starts on CPU (``deepspeed.comm.torch.TorchBackend.__init__`` -> ``build_shm_op``):
a JIT C++ build of 91 s on a fresh 2-core machine, before a newcomer's first
step. The op serves one collective only, ``inference_all_reduce`` (AutoTP's
``LinearAllreduce``); ZeRO training's collectives go through torch.distributed
(gloo) either way. So the bundled runners start the group without it
(runners/process_group.py) unless a run can use it: AutoTP in its DeepSpeed
config, or ``DSTUI_CPU_SHM_OP=1`` in its environment (DeepSpeed's own default).

On CPU, DeepSpeed's shm comm op creates ``/dev/shm/deepspeed_allreduce_buffer_*_<addr>_<port>_<rank>``
(66 MB per rank here) and never unlinks them. /dev/shm is RAM: after a few hundred runs the
machine ran out of memory (compilers and ranks OOM-killed, runs hanging). Each run uses its
own master port, so a finished run's buffers are exactly those named with its port.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SHM_OP_ENV = "DSTUI_CPU_SHM_OP"  # "1": build and use the op, as DeepSpeed does by itself
SHM_DIR = Path("/dev/shm")


def op_wanted(ds_config: Mapping[str, Any] | None, env: Mapping[str, str]) -> bool:
    """Whether a CPU run can use DeepSpeed's shm all-reduce op (AutoTP), or its environment asks for it."""
    if env.get(SHM_OP_ENV) == "1":
        return True
    tp = (ds_config or {}).get("tensor_parallel")
    try:
        return isinstance(tp, Mapping) and int(tp.get("autotp_size") or tp.get("tp_size") or 1) > 1
    except (TypeError, ValueError):
        return True  # a value dstui cannot read: keep DeepSpeed's own behaviour
PREFIX = "deepspeed_allreduce_buffer_"


def buffers_of_port(port: int | str, shm_dir: Path = SHM_DIR) -> list[Path]:
    return sorted(shm_dir.glob(f"{PREFIX}*_{port}_*"))


def remove_buffers(port: int | str | None, shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink the buffers of the run that used this master port; returns what was removed."""
    if not port:
        return []
    removed = []
    for p in buffers_of_port(port, shm_dir):
        with contextlib.suppress(OSError):
            p.unlink()
            removed.append(str(p))
    return removed


def master_port_of(argv: list[str] | None) -> str | None:
    """The master port of a deepspeed launcher argv (--master_port) or a dstui.execute.injob.ranks one (--master-port)."""
    argv = argv or []
    for i, arg in enumerate(argv):
        for flag in ("--master_port", "--master-port"):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None
