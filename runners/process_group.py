"""The bundled runners' process group: a rendezvous bound to MASTER_ADDR only, leaving it, exiting.

Apart from runners/common.py (model, data, versions) because it is its own
concern: where rank 0's store listens (issue 33.7), how ranks leave the group
together, and why a finished rank skips the interpreter's teardown.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Any, NoReturn

_LISTENER: list[socket.socket] = []  # the rendezvous socket rank 0 hands to torch: alive as long as the store
SHM_OP_SKIPPED: list[bool] = []  # [True] once skip_unused_shm_op left DeepSpeed's CPU shm op out (the header says so)


def is_loopback(addr: str) -> bool:
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(info[4][0] in ("127.0.0.1", "::1") or info[4][0].startswith("127.") for info in infos)


def listen_on(addr: str, port: int) -> socket.socket | None:
    """A socket listening on exactly ``addr:port``; None where ``addr`` is not an address of this host.

    torch's TCPStore listens on every address whatever host it is given
    (``*:port``); bound here and handed over as ``master_listen_fd``, it
    listens only where it must. A port in use is the caller's error, as before.
    """
    family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(where)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:
            return None
        raise
    sock.listen(1024)
    return sock


def _store_on(dist: Any, listener: socket.socket, addr: str, port: int, world: int, timeout: Any) -> Any:
    """rank 0's TCPStore on ``listener``; None where this torch takes no ``master_listen_fd`` (or not with libuv)."""
    for extra in ({}, {"use_libuv": False}):
        try:
            return dist.TCPStore(addr, port, world, True, timeout, master_listen_fd=listener.fileno(), multi_tenant=True, **extra)
        except (TypeError, RuntimeError, ValueError):
            continue
    return None


def one_node(env: dict[str, str] | os._Environ[str]) -> bool:
    """Whether every rank of the job runs on this node (the launchers' LOCAL_SIZE / CROSS_SIZE say so)."""
    world = env.get("WORLD_SIZE")
    return env.get("CROSS_SIZE") == "1" or world in (env.get("LOCAL_SIZE"), env.get("LOCAL_WORLD_SIZE"))


def skip_unused_shm_op() -> bool:
    """Start DeepSpeed's process group on CPU without building its shm all-reduce op, where no step uses it.

    The op serves AutoTP's ``inference_all_reduce`` only (dstui/core/shm.py), and
    its JIT build took 91 s of a newcomer's first run on 2 cores. DeepSpeed's
    torch backend asks ``build_shm_op`` for it and goes on without it when that
    returns None, as on a platform the op does not support: every collective of
    training then goes through torch.distributed, as it did with the op. True
    when it was left out (the header says so); a DeepSpeed without that hook
    keeps its own behaviour.
    """
    import json
    from pathlib import Path

    from dstui.core import shm

    try:
        ds_config = json.loads(Path(os.environ["DSTUI_DS_CONFIG"]).read_text()) if os.environ.get("DSTUI_DS_CONFIG") else {}
    except (OSError, ValueError):
        ds_config = {}
    if shm.op_wanted(ds_config if isinstance(ds_config, dict) else {}, os.environ):
        return False
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return False
    import importlib

    try:  # by module name: the attribute deepspeed.comm.torch is torch itself (comm's `import torch`)
        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
    except ImportError:
        return False
    if not callable(getattr(ds_torch_comm, "build_shm_op", None)):
        return False
    ds_torch_comm.build_shm_op = lambda: None
    SHM_OP_SKIPPED[:] = [True]
    return True


def init_distributed() -> None:
    """``deepspeed.init_distributed()``, with the rendezvous bound to MASTER_ADDR only (issue 33.7).

    A one-node job (MASTER_ADDR loopback, as dstui.execute.injob.ranks and DeepSpeed's
    single-node launch give it) listens on 127.0.0.1 only: the store, and gloo's
    and NCCL's own sockets (their interface is ``lo`` unless the user chose one).
    A multi-node job's store listens on the address its scheduler gave as
    MASTER_ADDR. Without the launcher's variables it is DeepSpeed's own path.
    """
    import datetime

    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    skip_unused_shm_op()
    env = os.environ
    if dist.is_initialized() or not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        deepspeed.init_distributed()
        return
    rank, world, addr, port = int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"])
    local = is_loopback(addr)
    if local and not one_node(env):
        # a host name that resolves to loopback here only (Debian's 127.0.1.1 line) while the
        # other nodes reach it by its real address: torch's own store, on every address
        deepspeed.init_distributed()
        return
    if local:
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    timeout = datetime.timedelta(minutes=30)  # DeepSpeed's default_pg_timeout
    listener = listen_on(addr, port) if rank == 0 else None
    if rank == 0 and listener is None:
        print(f"dstui runner: MASTER_ADDR {addr} is not an address of this host; torch's store listens on all",
              file=sys.stderr, flush=True)  # fmt: skip
        deepspeed.init_distributed()
        return
    if listener is not None:
        store = _store_on(dist, listener, addr, port, world, timeout)
        if store is None:  # an older torch: its own store, on every address
            listener.close()
            print("dstui runner: this torch cannot take a bound socket for its store; it listens on all addresses",
                  file=sys.stderr, flush=True)  # fmt: skip
            deepspeed.init_distributed()
            return
        _LISTENER.append(listener)
    else:
        store = dist.TCPStore(addr, port, world, False, timeout)
    backend = get_accelerator().communication_backend_name()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    deepspeed.init_distributed()  # adopts the group (DeepSpeed's cdb over torch's)


def leave_process_group() -> None:
    """Leave the process group together; rank 0 then unlinks DeepSpeed's CPU all-reduce buffers.

    DeepSpeed never unlinks its /dev/shm buffers (66 MB a rank, in RAM); they
    are named by master port, so this job's are exactly those of MASTER_PORT.
    """
    import deepspeed

    deepspeed.comm.barrier()
    first = deepspeed.comm.get_rank() == 0
    deepspeed.comm.destroy_process_group()
    if first:
        from dstui.core import shm

        shm.remove_buffers(os.environ.get("MASTER_PORT"))


def exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown once everything is written.

    After a finished run, tearing down the interpreter can still kill the
    process: gloo's threads were seen to abort there ("terminate called
    without an active exception", SIGABRT), turning a run whose summary was
    written into a failed one. After an error, a normal exit would run the
    process group's destructor, which blocks while the other rank waits in a
    collective, so the launcher would never see this rank die.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
