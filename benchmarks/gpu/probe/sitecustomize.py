"""A first-step probe for any DeepSpeed script (issue 31): where does a rank's first step go?

Put this folder first on PYTHONPATH and name an output folder in
``DSTUI_STEP1_PROBE``; every Python process then loads this file at start-up
(Python's ``sitecustomize`` hook) and, when it imports DeepSpeed's engine,
wraps the engine's ``forward``/``backward``/``step`` for the first optimizer
step only. Nothing else changes, so the bare script (benchmarks/gpu/bare_ds.py)
and dstui's runner are probed alike, neither knowing it. Per process it writes
``probe-<pid>.json``:

* ``pending_s``: a device synchronize at the first forward: GPU work still
  queued from the set-up, which the first step would otherwise wait for;
* ``forward_s``, ``backward_s``, ``step_s``: each part of step 1, synchronized;
* ``profile``: torch.profiler's tables of step 1 (self CUDA time, self CPU time);
* ``jit_cache_before``/``_after``: the CUDA driver's JIT cache around step 1; ``process``:
  the CPUs, priority and load the process had;
* with ``DSTUI_STEP1_PROBE_SDPA=1``, ``sdpa_first_s``/``sdpa_second_s``: one SDPA
  forward+backward of fixed shapes run twice before step 1 (what a first call costs
  in this process, whatever the model feeds it);
* ``torch``: the switches that choose kernels (SDPA backends, TF32, cuDNN,
  allocator settings, threads) and the process's environment (values of names
  that may hold secrets are left out).

Any other ``sitecustomize`` further along ``sys.path`` still runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import time

_OUT = os.environ.get("DSTUI_STEP1_PROBE")
_TARGET = "deepspeed.runtime.engine"
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")


def _chain_other_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _first_call_tools():  # noqa: ANN202 - a module
    """benchmarks/gpu/sdpa_first_call.py (its JIT-cache reading and its SDPA calls), loaded by its file."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdpa_first_call.py")
    spec = importlib.util.spec_from_file_location("dstui_sdpa_first_call", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _process() -> dict[str, object]:
    """What the OS gives this process: CPUs it may run on, priority, load."""
    out: dict[str, object] = {"cpus": len(os.sched_getaffinity(0)), "nice": os.getpriority(os.PRIO_PROCESS, 0)}
    out["loadavg"] = os.getloadavg()
    try:
        with open("/proc/self/status") as fh:
            out.update(
                (k, v.strip()) for k, v in (line.split(":", 1) for line in fh) if k in ("Cpus_allowed_list", "Threads")
            )
    except OSError:
        pass
    return out


def _env() -> dict[str, str]:
    return {
        k: ("<hidden>" if any(w in k.upper() for w in _SECRET_WORDS) else v[:300])
        for k, v in sorted(os.environ.items())
    }


def _torch_switches() -> dict[str, object]:
    import torch

    b = torch.backends
    out: dict[str, object] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled"):
        fn = getattr(b.cuda, name, None)
        out[name] = fn() if fn else None
    out["matmul_tf32"] = b.cuda.matmul.allow_tf32
    out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    out["cudnn_benchmark"] = b.cudnn.benchmark
    out["cudnn_deterministic"] = b.cudnn.deterministic
    out["deterministic_algorithms"] = torch.are_deterministic_algorithms_enabled()
    out["grad_enabled"] = torch.is_grad_enabled()
    out["allocator"] = torch.cuda.memory._get_current_allocator().__class__.__name__ if torch.cuda.is_available() else None
    if torch.cuda.is_available():
        out["mem_reserved"] = torch.cuda.memory_reserved()
        out["mem_allocated"] = torch.cuda.memory_allocated()
        out["lazy_loading"] = os.environ.get("CUDA_MODULE_LOADING")
    return out


class _Probe:
    def __init__(self) -> None:
        self.rec: dict[str, object] = {"argv0": sys.argv[0], "pid": os.getpid()}
        self.prof = None
        self.done = False
        self.in_step1 = False

    def sync(self) -> float:
        import torch

        t = time.perf_counter()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def around(self, name: str, fn):  # noqa: ANN001, ANN202 - wraps a bound method
        probe = self

        def wrapped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if probe.done:
                return fn(*args, **kwargs)
            if name == "forward" and not probe.in_step1:
                probe.in_step1 = True
                probe.rec["t_first_forward"] = time.time()
                probe.rec["torch_before"] = _torch_switches()
                probe.rec["pending_s"] = probe.sync()
                tools = _first_call_tools()
                probe.rec["jit_cache_before"] = tools.jit_cache()
                probe.rec["process"] = _process()
                if os.environ.get("DSTUI_STEP1_PROBE_SDPA") == "1":
                    probe.rec["sdpa_first_s"], probe.rec["sdpa_second_s"] = tools.first_calls()
                import torch

                try:
                    probe.prof = torch.profiler.profile(
                        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
                    )
                    probe.prof.__enter__()
                except Exception as e:  # noqa: BLE001 - a probe must not stop the run
                    probe.prof = None
                    probe.rec["profile_error"] = repr(e)
                probe.rec["t_profiler_on"] = time.time()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            probe.sync()
            probe.rec[f"{name}_s"] = probe.rec.get(f"{name}_s", 0.0) + time.perf_counter() - t
            if name == "step" and getattr(args[0], "is_gradient_accumulation_boundary", lambda: True)():
                probe.finish()
            return out

        return wrapped

    def finish(self) -> None:
        self.done = True
        self.rec["t_step1_end"] = time.time()
        try:
            if self.prof is None:
                raise RuntimeError("no profiler")
            self.prof.__exit__(None, None, None)
            ka = self.prof.key_averages()
            self.rec["profile"] = {
                "by_self_cuda": ka.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=70),
                "by_self_cpu": ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70),
            }
        except Exception as e:  # noqa: BLE001 - a probe must not stop the run
            self.rec["profile_error"] = repr(e)
        self.rec["torch_after"] = _torch_switches()
        self.rec["jit_cache_after"] = _first_call_tools().jit_cache()
        self.rec["env"] = _env()
        os.makedirs(_OUT, exist_ok=True)
        with open(os.path.join(_OUT, f"probe-{os.getpid()}.json"), "w") as fh:
            json.dump(self.rec, fh, indent=1)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):  # noqa: ANN001, ANN202
            original(module)
            cls = module.DeepSpeedEngine
            probe = _Probe()
            for meth in ("forward", "backward", "step"):
                setattr(cls, meth, probe.around(meth, getattr(cls, meth)))

        loader.exec_module = exec_module
        return spec


if _OUT:
    sys.meta_path.insert(0, _Hook())
_chain_other_sitecustomize()
