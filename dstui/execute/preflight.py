"""Checks before anything is launched: does each run's model exist where it will run?

A misspelt model used to launch, wait on hub retries for most of a minute, create
MLflow runs and end as "exit code 2". Now it is one line before launch: a preset
in configs/models/, an existing local folder, or a hub id that is in the local
Hugging Face cache or (when online) known to the hub.
"""

from __future__ import annotations

import os
from pathlib import Path

from dstui.core.errors import SpecError
from dstui.core.paths import CONFIGS_DIR
from dstui.spec.models import RunSpec

MODELS_DIR = CONFIGS_DIR / "models"
HUB_TIMEOUT_S = 5.0


def presets() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def model_problem(model: str) -> str | None:
    """Why ``model`` cannot be loaded by a runner, or None."""
    if (MODELS_DIR / f"{model}.json").is_file():
        return None
    path = Path(model).expanduser()
    if path.exists():
        return None if (path / "config.json").is_file() or path.is_file() else f"folder {model!r} has no config.json"
    if model.startswith(("/", ".", "~")) or "/" not in model:
        kind = "no such folder" if model.startswith(("/", ".", "~")) else "not a preset"
        return f"unknown model {model!r}: {kind}; presets: {', '.join(presets())}; or a local folder, or a hub id (org/name)"
    return _hub_problem(model)


def _hub_problem(repo_id: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None  # the runner's environment decides
    try:
        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return None
    except Exception:  # a malformed id: the hub check below says what is wrong
        pass
    if offline():
        return f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set (no download)"
    try:
        from huggingface_hub import model_info
        from huggingface_hub.errors import RepositoryNotFoundError

        model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except RepositoryNotFoundError:
        return f"model {repo_id!r} does not exist on the Hugging Face hub (or needs a token)"
    except Exception as e:
        return f"model {repo_id!r} is not cached and the hub cannot be asked ({type(e).__name__}); set HF_HUB_OFFLINE=1 to run offline"
    return None


def check_models(runs: list[RunSpec], *, file: str | None) -> None:
    """One line (file, condition, field 'model') for the first model no runner could load."""
    seen: dict[str, str | None] = {}
    for r in runs:
        if r.settings.kind == "command":
            continue
        model = r.settings.model
        if model not in seen:
            seen[model] = model_problem(model)
        if seen[model]:
            raise SpecError(seen[model] or "", file=file, condition=r.condition, field="model")
