"""Credentials never leave the process that needs them: not in files, artifacts, logs or params.

The rules, applied by every writer through this module:

1. A URI's ``user:password@`` part becomes ``***@`` wherever it appears in text
   (tracking URIs, commands, error messages, logs, failure reasons).
2. Every value of a spec's ``env`` is masked whole (``***``) unless its name is
   allow-listed: the built-in harmless names below (device selection, thread
   counts, NCCL/torch/DeepSpeed switches, offline flags), or the spec's own
   ``env_visible`` list (``NAME`` or ``PREFIX_*``). Masking by default, not by a
   secret-looking name: a ``DB_URL`` or ``MY_SECRET_THING`` is hidden although
   neither says TOKEN or PASSWORD. Shown values still lose URI credentials.
3. The real values live only in the job's environment and in a private file
   *outside* the run and batch folders (those are uploaded, shared and copied):
   ``$XDG_STATE_HOME/dstui/private/<hash of the batch folder>/<run>.json``
   (``DSTUI_PRIVATE_DIR`` overrides the root), mode 0600 in 0700 folders.
4. Hidden values this process has read (:func:`remember`) are masked in text
   dstui writes itself, too (everything the supervisor prints into its log,
   command lines), so an exception that quotes one does not leak it.

5. Command lines (``command``, ``extra_args``) and free text: the value after a
   flag whose name says token/key/secret/password/auth (``--hf_token V``,
   ``--api-key=V``, ``-p V``), an ``Authorization:`` header's credentials, a
   quoted secret key's value (``{"token": "V"}``), a secret assignment
   (``HF_TOKEN=V``) and every well-known token shape (``hf_…``, ``sk-…``,
   ``ghp_…``, ``github_pat_…``, ``AKIA…``, ``xox?-…``) become ``***``
   (:mod:`dstui.core.credential_text`). An argv element may take a value from
   the environment by reference, ``{env:NAME}``: files show the reference, only
   the launched process gets the value (:func:`resolve_env_refs`).

Every scan is linear in its input (issue 33.1: the scrubber reads whole run
logs on upload; benchmarks/scrubber.py: a 10 MiB line in well under a second).

What a job prints about its own environment is its own output (stdout.log);
text artifacts lose URI credentials, token shapes and secret flags' values on
upload (:func:`strip_credentials`), nothing more.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# the free-text rules live in credential_text; MASK and strip_credentials are imported from here by most of dstui
from dstui.core.credential_text import MASK, is_secret_flag, keeps_value, strip_credentials
from dstui.core.terminal import filter_output

# Shown by default: harmless switches a reader of a report wants to see.
VISIBLE_NAMES = frozenset(
    {
        "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
        "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_ENABLE_HF_TRANSFER", "HF_HOME", "HF_HUB_CACHE",
        "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TRANSFORMERS_VERBOSITY",
        "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONHASHSEED", "PYTHONWARNINGS",
        "PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "PATH", "LD_LIBRARY_PATH",
        "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "NVIDIA_VISIBLE_DEVICES",
        "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    }
)  # fmt: skip
# Whole families of library switches; a name among them that looks secret stays hidden.
VISIBLE_PREFIXES = (
    "CUDA_", "NCCL_", "GLOO_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_", "TRITON_",
    "DS_", "OMP_", "KMP_", "MKL_", "CUBLAS_", "CUDNN_", "DSTUI_",
)  # fmt: skip
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")
# A hidden value shorter than this is not searched for in free text ("1" would mask every digit).
MIN_TEXT_MASK = 4
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")  # an env_visible entry: NAME or PREFIX_*

ENV_REF = re.compile(r"\{env:([A-Za-z_][A-Za-z0-9_]{0,127})\}")  # an argv element's value from the environment
_KNOWN: set[str] = set()  # hidden values this process has read (see remember)


def is_secret(name: str) -> bool:
    """Whether a name looks secret; only used to keep such names out of the built-in prefixes."""
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS)


def is_visible(name: str, visible: Iterable[str] = ()) -> bool:
    """Whether an env variable's value may be shown: built-in allow-list or the spec's ``env_visible``."""
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in visible):
        return True
    if name in VISIBLE_NAMES:
        return True
    return name.startswith(VISIBLE_PREFIXES) and not is_secret(name)


def hidden_names(env: Mapping[str, Any], visible: Iterable[str] = ()) -> set[str]:
    visible = tuple(visible)
    return {n for n in env if not is_visible(str(n), visible)}


def mask_env(env: Mapping[str, Any], visible: Iterable[str] = ()) -> dict[str, Any]:
    """``env`` with every value not allow-listed replaced by ``***``; shown ones lose URI credentials."""
    visible = tuple(visible)
    return {n: (_redact(v, visible) if is_visible(str(n), visible) else MASK) for n, v in env.items()}


def mask_argv(argv: Iterable[str], values: Iterable[str] = ()) -> list[str]:
    """An argv as files and the terminal show it: secret flags' values, token shapes, hidden values masked.

    ``--hf_token V`` (the next element) and ``--api-key=V`` both lose ``V``;
    ``{env:NAME}`` references stay as they are (they name, not hold, a value).
    """
    values = tuple(values)
    out: list[str] = []
    after_secret_flag = False
    previous = ""
    for arg in argv:
        if not isinstance(arg, str):
            out.append(arg)
            after_secret_flag = False
            continue
        if after_secret_flag and not arg.startswith("--"):
            out.append(arg if ENV_REF.fullmatch(arg) or keeps_value(previous, arg) else MASK)
            after_secret_flag = False
            continue
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("-") and " " not in flag and is_secret_flag(flag) and not ENV_REF.fullmatch(value):
            out.append(f"{flag}={MASK}")
        else:
            out.append(mask_text(arg, values))
        after_secret_flag = not eq and arg.startswith("-") and is_secret_flag(arg)
        previous = arg
    return out


class MissingEnvRef(KeyError):
    """An argv element names ``{env:NAME}`` and NAME is not set where the run starts."""

    def __str__(self) -> str:
        return f"{self.args[0]} is not set (the command names it as {{env:{self.args[0]}}})"


def resolve_env_refs(argv: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """The argv the process gets: every ``{env:NAME}`` replaced by ``env[NAME]`` (MissingEnvRef if unset)."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in env:
            raise MissingEnvRef(name)
        return env[name]

    return [ENV_REF.sub(value, a) if isinstance(a, str) and "{env:" in a else a for a in argv]


def visible_names_in(obj: object) -> list[str]:
    """Every ``env_visible`` entry anywhere in a spec dump (base settings, conditions, axes)."""
    found: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "env_visible" and isinstance(v, list):
                found += [str(x) for x in v]
            else:
                found += visible_names_in(v)
    elif isinstance(obj, list):
        for x in obj:
            found += visible_names_in(x)
    return found


def redact(obj: object, visible: Iterable[str] | None = None) -> object:
    """A copy safe to write anywhere: ``env`` values masked unless allow-listed, URI credentials stripped.

    ``visible`` defaults to every ``env_visible`` list found in ``obj``: a name a
    spec declares harmless in one condition is harmless in all of them.
    """
    return _redact(obj, tuple(visible_names_in(obj) if visible is None else visible))


ARGV_FIELDS = ("command", "extra_args")  # argv lists beside an env: hidden values masked there too, as in cmd.txt


def _redact(obj: object, visible: tuple[str, ...]) -> object:
    if isinstance(obj, dict):
        out = {k: (_env_field(v, visible) if k == "env" else _redact(v, visible)) for k, v in obj.items()}
        env = obj.get("env")
        hidden = [str(env[n]) for n in hidden_names(env, visible)] if isinstance(env, dict) else []
        for k in ARGV_FIELDS:  # in any dict: settings, conditions, launcher options
            if isinstance(obj.get(k), list):
                out[k] = mask_argv(obj[k], hidden)
        return out
    if isinstance(obj, list):
        return [_redact(x, visible) for x in obj]
    if isinstance(obj, str):
        return strip_credentials(obj)  # not mask_text: a hidden value may equal a setting (a model name)
    return obj


def _env_field(value: object, visible: tuple[str, ...]) -> object:
    """An ``env`` mapping, or a list of them (``axes: {env: [{...}, {...}]}``)."""
    if isinstance(value, dict):
        return mask_env(value, visible)
    if isinstance(value, list):
        return [_env_field(x, visible) for x in value]
    return _redact(value, visible)


# ---- hidden values in free text ----


def remember(env: Mapping[str, Any], visible: Iterable[str] = ()) -> None:
    """Note the hidden values of an env this process read, so :func:`mask_text` hides them in text."""
    for name in hidden_names(env, visible):
        value = str(env[name])
        if len(value) >= MIN_TEXT_MASK:
            _KNOWN.add(value)


def mask_text(text: str, values: Iterable[str] = ()) -> str:
    """Text dstui writes: URI credentials stripped, hidden values (given or remembered) masked."""
    text = strip_credentials(text)
    for value in sorted({*values, *_KNOWN}, key=len, reverse=True):
        if len(value) >= MIN_TEXT_MASK and value in text:
            text = text.replace(value, MASK)
    return text


def mask_output() -> None:
    """Mask everything this process prints: logging, tracebacks and warnings alike (the supervisor's log)."""
    filter_output(mask_text)


# ---- private files: dstui's own are this user's alone, whatever the umask ----

PRIVATE_UMASK = 0o077  # folders 0700, files 0600
USER_UMASK_ENV = "DSTUI_USER_UMASK"  # the umask dstui was started with (octal), for the jobs it launches


def private_umask() -> None:
    """Make everything this process (and the supervisor it starts) creates private: 0700/0600.

    Run folders, cmd.txt, status.json, the MLflow store and its artifact copies
    (MLflow copies keep the source's mode) are created under this umask. The
    user's own umask is remembered for the jobs (:func:`user_umask`): a job's
    files (a shared cache, checkpoints) are as its user wants them.
    """
    old = os.umask(PRIVATE_UMASK)
    os.environ.setdefault(USER_UMASK_ENV, oct(old))


def user_umask() -> int:
    """The umask a launched job gets: the one dstui was started with."""
    try:
        return int(os.environ[USER_UMASK_ENV], 8)
    except (KeyError, ValueError):
        current = os.umask(PRIVATE_UMASK)
        os.umask(current)
        return current


def private_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) and make it and its parent 0700, whatever the umask."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for folder in (path.parent, path):
        with contextlib.suppress(OSError):  # a folder of someone else's keeps its mode
            os.chmod(folder, 0o700)
    return path


# ---- the real values: outside the run and batch folders ----


def private_root() -> Path:
    explicit = os.environ.get("DSTUI_PRIVATE_DIR")
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "dstui" / "private"


def _batch_key(batch_dir: Path) -> str:
    where = str(Path(batch_dir).absolute())
    return f"{Path(where).name[:60]}-{hashlib.sha256(where.encode()).hexdigest()[:16]}"


def private_file(run_dir: Path) -> Path:
    """Where a run's unmasked spec lives: per user, keyed by the batch folder's absolute path."""
    run_dir = Path(run_dir)
    return private_root() / _batch_key(run_dir.parent) / f"{run_dir.name}.json"


def keep_private(run_dir: Path, data: dict | None) -> None:
    """Store a run's unmasked spec (mode 0600, folders 0700), or forget it when ``data`` is None."""
    path = private_file(run_dir)
    if data is None:
        path.unlink(missing_ok=True)
        return
    path.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a root that exists keeps its mode
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path.parent, 0o700)  # whatever the umask
    marker = path.parent / "batch_dir"
    if not marker.exists():
        marker.write_text(str(Path(run_dir).parent.absolute()))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)  # mkstemp: 0600
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_private(run_dir: Path) -> dict | None:
    try:
        return json.loads(private_file(run_dir).read_text())
    except (OSError, ValueError):
        return None


def prune_private() -> int:
    """Forget the private values of batches whose folder is gone; the number of batches forgotten."""
    root = private_root()
    gone = 0
    for entry in root.iterdir() if root.is_dir() else []:
        marker = entry / "batch_dir"
        if entry.is_symlink() or not entry.is_dir() or not marker.is_file():
            continue
        if not Path(marker.read_text().strip()).is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            gone += 1
    return gone
