"""Checks before anything is launched: does each run's model exist where it will run?

A misspelt model used to launch, wait on hub retries for most of a minute, create
MLflow runs and end as "exit code 2". Now it is one line before launch: a preset
in configs/models/, an existing local folder, or a hub id that is in the local
Hugging Face cache or (when online) known to the hub.

A local folder's tokenizer is tried too (issue 31): one that turns the text into
no tokens, or into ids beyond the model's vocabulary, used to die at data
loading with a torch error. A folder with no tokenizer files trains on byte
tokens (dstui.core.model_folder) and needs no check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dstui.core import ds_answers, model_folder
from dstui.core.errors import SpecError
from dstui.core.paths import CONFIGS_DIR
from dstui.spec.experiment import RunSpec

MODELS_DIR = CONFIGS_DIR / "models"
HUB_TIMEOUT_S = 5.0
TOKENIZER_TIMEOUT_S = 120.0
#: the text a folder's tokenizer is tried on: the head of the shipped corpus
PROBE_TEXT = CONFIGS_DIR / "data" / "tiny-corpus.txt"
PROBE_CHARS = 4000

# Runs in a child python: loading a tokenizer imports transformers (seconds, and
# more than dstui may import); a crash there is a reason, not a dstui traceback.
_TRY_TOKENIZER = """
import json, sys
folder, probe, chars = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(open(probe, encoding="utf-8").read()[:chars])["input_ids"]
except Exception as e:
    lines = (str(e).strip() or type(e).__name__).splitlines()
    print(json.dumps({"error": lines[0][:300]}))
else:
    print(json.dumps({"tokens": len(ids), "max_id": max(ids) if ids else None}))
"""


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


def tokenizer_problem(model: str, dataset: str) -> str | None:
    """Why a local folder's tokenizer cannot feed its model the text, or None.

    Only folders with tokenizer files are tried (in a child python, the answer
    kept per folder content like DeepSpeed's answers); synthetic data needs no
    tokenizer. Hub models are checked by the runner itself, in one line too.
    """
    if dataset == "synthetic" or not model_folder.is_local_folder(model):
        return None
    files = model_folder.tokenizer_files(model)
    if not files:
        return None
    folder = Path(model).expanduser().resolve()
    vocab = model_folder.config_vocab(folder)
    stats = []
    for name in [*files, "config.json"]:
        try:
            st = (folder / name).stat()
            stats.append([name, st.st_size, st.st_mtime_ns])
        except OSError:
            stats.append([name, None, None])
    question = {"folder": str(folder), "files": stats, "vocab": vocab, "python": sys.executable, "chars": PROBE_CHARS}
    try:  # a good answer is kept; a refusal is asked again next time (the user may have fixed it)
        answer = ds_answers.remembered("tokenizer-probe", question, lambda: _kept_if_good(_probe(folder), vocab))
    except _Refused as e:
        answer = e.answer
    if answer.get("error"):
        return f"model {model!r}: its tokenizer cannot be loaded: {answer['error']}"
    if not answer.get("tokens"):
        return (f"model {model!r}: its tokenizer yields no tokens for text (an empty vocabulary?); "
                f"remove its tokenizer files ({', '.join(files)}) to train on byte tokens")
    top = answer.get("max_id")
    if vocab is not None and isinstance(top, int) and top >= vocab:
        return f"model {model!r}: its tokenizer yields token id {top}, beyond the model's vocabulary ({vocab}, config.json)"
    return None


class _Refused(Exception):
    def __init__(self, answer: dict) -> None:
        super().__init__(answer)
        self.answer = answer


def _kept_if_good(answer: dict, vocab: int | None) -> dict:
    top = answer.get("max_id")
    if answer.get("error") or not answer.get("tokens") or (vocab is not None and isinstance(top, int) and top >= vocab):
        raise _Refused(answer)
    return answer


def _probe(folder: Path) -> dict:
    """What the folder's tokenizer makes of the probe text: tokens and the largest id, or the error."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _TRY_TOKENIZER, str(folder), str(PROBE_TEXT), str(PROBE_CHARS)],
            capture_output=True, text=True, timeout=TOKENIZER_TIMEOUT_S,
            env={**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"trying it failed ({type(e).__name__})"}
    for line in reversed(proc.stdout.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    return {"error": tail[:300]}


def check_models(runs: list[RunSpec], *, file: str | None) -> None:
    """One line (file, condition, field 'model') for the first model no runner could load or feed."""
    seen: dict[tuple[str, str], str | None] = {}
    for r in runs:
        if r.settings.kind == "command":
            continue
        key = (r.settings.model, r.settings.dataset)
        if key not in seen:
            seen[key] = model_problem(key[0]) or tokenizer_problem(*key)
        if seen[key]:
            raise SpecError(seen[key] or "", file=file, condition=r.condition, field="model")
