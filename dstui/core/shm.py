"""Clean-up of DeepSpeed's shared-memory all-reduce buffers.

On CPU, DeepSpeed's shm comm op creates ``/dev/shm/deepspeed_allreduce_buffer_*_<addr>_<port>_<rank>``
(66 MB per rank here) and never unlinks them. /dev/shm is RAM: after a few hundred runs the
machine ran out of memory (compilers and ranks OOM-killed, runs hanging). Each run uses its
own master port, so a finished run's buffers are exactly those named with its port.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

SHM_DIR = Path("/dev/shm")
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
