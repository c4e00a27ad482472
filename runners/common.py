"""Helpers shared by the bundled runners: model, data, memory, FLOPs, versions.

The runners are the only place where torch, deepspeed and transformers are
imported (see docs/ARCHITECTURE.md). The heavy imports stay inside functions
so that ``--help`` and argument errors answer at once.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import socket
import sys
from pathlib import Path
from typing import Any

REPO_DIR = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO_DIR / "configs" / "models"
DATA_DIR = REPO_DIR / "configs" / "data"
TINY_CORPUS = DATA_DIR / "tiny-corpus.txt"


class RunnerError(Exception):
    """A problem the user can fix (bad preset, bad dataset, ...): printed without a traceback."""


# -- models -----------------------------------------------------------------


def presets() -> list[str]:
    """Names of the model presets shipped in configs/models/."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def is_preset(name: str) -> bool:
    return (MODELS_DIR / f"{name}.json").is_file()


def looks_like_hub_or_path(name: str) -> bool:
    """A hub id has an owner ('org/name'); a local path exists. Anything else is a typo of a preset."""
    return "/" in name or Path(name).exists()


def model_config(name: str) -> Any:
    """The transformers config of a preset, a local path or a hub id (config only, no weights)."""
    # Name checks first: a typo should not wait for transformers to import.
    if not is_preset(name) and not looks_like_hub_or_path(name):
        raise RunnerError(
            f"unknown model '{name}': not a preset in {MODELS_DIR} (available: "
            f"{', '.join(presets())}), a local path or a hub id (org/name)"
        )
    from transformers import AutoConfig

    if is_preset(name):
        cfg = json.loads((MODELS_DIR / f"{name}.json").read_text())
        model_type = cfg.pop("model_type", None)
        if not model_type:
            raise RunnerError(
                f"model preset '{name}' has no 'model_type' ({MODELS_DIR / name}.json)"
            )
        return AutoConfig.for_model(model_type, **cfg)
    try:
        return AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        raise RunnerError(f"cannot load the config of model '{name}': {e}") from None


def is_seq2seq(config: Any) -> bool:
    """An encoder-decoder model (T5, BART, ...) rather than a causal LM."""
    return bool(getattr(config, "is_encoder_decoder", False))


def build_model(name: str, config: Any, *, load_weights: bool, attn_implementation: str) -> Any:
    """A causal or seq2seq LM: random init from ``config`` (seeded by the caller), or pretrained weights."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if is_seq2seq(config) else AutoModelForCausalLM
    if load_weights:
        if is_preset(name):
            raise RunnerError(
                f"--load-weights needs a hub id or a local path; '{name}' is a preset (config only)"
            )
        return auto.from_pretrained(name, attn_implementation=attn_implementation)
    return auto.from_config(config, attn_implementation=attn_implementation)


def count_params(model: Any) -> int:
    """All the model's parameter elements; a ZeRO-3 parameter counts its whole shape (``ds_numel``), not its empty stand-in."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def arch(config: Any) -> tuple[int, int, int, int, int]:
    """(layers, hidden, heads, kv_heads, vocab) under the names llama- and gpt2-style configs use."""
    c = text_config(config)
    layers = getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", 0)
    hidden = getattr(c, "hidden_size", None) or getattr(c, "n_embd", 0)
    heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", 1)
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    return int(layers), int(hidden), int(heads), int(kv_heads), int(c.vocab_size)


# -- memory, devices, versions ----------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process (CPU runs report host memory)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return int(psutil.Process().memory_info().rss)


def peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux (bytes on macOS, where this is a slight over-report).
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def memory(accel: Any, on_cpu: bool) -> tuple[int, int]:
    """(allocated, peak) in bytes: accelerator memory on a GPU, process RSS on CPU."""
    if on_cpu:
        rss = rss_bytes()
        # ru_maxrss and statm count pages slightly differently; a peak below the
        # current value would read as nonsense in a chart.
        return rss, max(rss, peak_rss_bytes())
    return int(accel.memory_allocated()), int(accel.max_memory_allocated())


def device_info(accel: Any) -> dict[str, Any]:
    name = accel.device_name()
    on_cpu = name == "cpu"
    gpu_name = None
    gpu_count = 0
    if not on_cpu:
        gpu_count = int(accel.device_count())
        try:
            import torch

            gpu_name = (
                torch.cuda.get_device_name(accel.current_device()) if name == "cuda" else name
            )
        except Exception:  # noqa: BLE001 - naming a device must never stop a run
            gpu_name = name
    return {"device": name, "on_cpu": on_cpu, "gpu_name": gpu_name, "gpu_count": gpu_count}


def versions() -> dict[str, Any]:
    import deepspeed
    import torch
    import transformers

    return {
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def deepspeed_git_sha() -> str | None:
    try:
        from deepspeed import git_version_info
    except ImportError:
        return None
    sha = getattr(git_version_info, "git_hash", None)
    return sha if sha and sha != "unknown" else None


# torch's (counter group, key prefix) for each cache dstui.core.phases.COMPILE_CACHES names
_TORCH_COUNTERS = {"fxgraph": ("inductor", "fxgraph_cache_"), "autograd": ("aot_autograd", "autograd_cache_")}


def compile_cache_counts() -> dict[str, int]:
    """How torch.compile's caches answered in this process: did a repeat find its graphs?

    ``compile_cache_fxgraph_hit`` (Inductor's FX graph cache), ``..._miss``,
    ``..._bypass`` and the same for AOTAutograd's cache (``autograd``), from
    torch's own counters; only outcomes that happened, nothing when the run
    compiled nothing. A repeat of a compiled condition that still shows misses
    recompiles, whatever the cache folders hold (docs/gpu-validation/README.md 6c).
    """
    from dstui.core.phases import CACHE_OUTCOMES, COMPILE_CACHES, compile_cache_key

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {}
    out: dict[str, int] = {}
    for name in COMPILE_CACHES:
        group, prefix = _TORCH_COUNTERS[name]
        for outcome in CACHE_OUTCOMES:
            count = int(utils.counters[group].get(prefix + outcome, 0))
            if count:
                out[compile_cache_key(name, outcome)] = count
    return out


def compile_graph_counts() -> dict[str, int]:
    """What torch.compile compiled in this process so far: frames, graphs, graph breaks, captured ops.

    A recompile adds a frame and a graph, a graph break a graph and a break: two runs that
    compiled the same thing have the same four counts (the sp-check's capture must not
    change them, runners/sp_probe.py). Nothing when nothing was compiled.
    """
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None or not utils.counters["frames"].get("total"):
        return {}
    c = utils.counters
    return {
        "dynamo_frames": int(c["frames"].get("total", 0)),
        "dynamo_graphs": int(c["stats"].get("unique_graphs", 0)),
        "dynamo_graph_breaks": int(sum(c["graph_break"].values())),
        "dynamo_ops": int(c["stats"].get("calls_captured", 0)),
    }


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's generators (every accelerator's) as transformers' set_seed does.

    The same calls in the same order, so the same seed gives the same initial
    weights as before; without ``transformers.trainer_utils``, which imports
    peft, and through it transformers' auto-model tables and a dozen model
    families, when peft is installed: 11.5 s of a llama-1b rank's 'model' phase
    on the lent H100 image (py-spy, benchmarks/gpu/diag_startup.sh), where
    building the model itself took 0.1 s.
    """
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)  # safe without CUDA: seeds lazily
    for name in ("mlu", "musa", "npu", "hpu", "xpu"):
        backend = getattr(torch, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            backend.manual_seed_all(seed)


#: Packages ``import deepspeed`` pulls in that no rank uses: DeepSpeed's autotuner imports
#: mlflow if it can (for its own trial logging; dstui's supervisor does the tracking).
UNUSED_IN_RANKS = ("mlflow",)


def skip_unused_imports() -> list[str]:
    """Mark :data:`UNUSED_IN_RANKS` as absent in this process; return what was marked.

    mlflow is installed beside DeepSpeed in dstui's own environment, and importing
    it costs each rank ~1.9 s of a ~7 s import (torch, deepspeed, transformers)
    here: measured with and without, see docs/BENCHMARKS.md. DeepSpeed's guard
    (``try: import mlflow``) then simply finds it missing. ``DSTUI_RANK_IMPORTS=all``
    keeps everything importable. Must run before deepspeed is imported.
    """
    if os.environ.get("DSTUI_RANK_IMPORTS") == "all":
        return []
    marked = [name for name in UNUSED_IN_RANKS if name not in sys.modules]
    for name in marked:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    return marked


def isolate_op_cache() -> str | None:
    """Give this DeepSpeed install its own JIT-op build folder (unless TORCH_EXTENSIONS_DIR is set).

    torch keeps JIT extensions in one folder per python/torch flavour, shared
    by every DeepSpeed on the machine. When runs of two DeepSpeed revisions
    start together, one can load the other's freshly built ``.so`` (seen
    here: "module 'deepspeed_shm_comm' has no attribute 'vector_kernel_level'"
    when 0.18.0 and 0.19.8 ran side by side). A folder per install path and
    torch build keeps revisions apart; the first run of each pays the build.
    Must run before deepspeed is imported.
    """
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return None
    import hashlib
    import importlib.util

    spec = importlib.util.find_spec("deepspeed")
    if spec is None or spec.origin is None:
        return None
    import torch

    ident = f"{Path(spec.origin).parent.resolve()}|{torch.__version__}|{sys.version_info[:2]}"
    tag = hashlib.sha1(ident.encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache / "torch_extensions" / f"dstui-{tag}"
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder)
    return str(folder)


def _building_in(folder: Path) -> bool:
    """Whether a process on this host works in ``folder`` (ninja and the compilers run there)."""
    target = str(folder.resolve())
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "cwd") == target:
                return True
        except OSError:
            continue
    return False


def clear_stale_op_locks(min_age_s: float = 120.0) -> list[str]:
    """Remove JIT-build lock files that no live build holds; return what was removed.

    torch's FileBaton waits forever on ``<ext>/lock``; a build killed midway
    (a cancelled run, a test timeout) leaves the lock behind and every later
    run hangs in deepspeed.initialize. Seen here with fused_adam. A lock is
    stale when it is older than ``min_age_s`` and no process has its folder as
    working directory (Linux /proc; elsewhere nothing is touched).
    """
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root or not Path("/proc/self/cwd").exists():
        return []
    import time

    removed = []
    for lock in Path(root).glob("*/lock"):
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:
            continue
        if age >= min_age_s and not _building_in(lock.parent):
            try:
                lock.unlink()
            except OSError:
                continue
            removed.append(str(lock))
    return removed


def hostname() -> str:
    return socket.gethostname()
