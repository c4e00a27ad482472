"""What a run ran with, as far as its record tells: the values conditions are grouped and compared on.

A run's identity is its full effective settings: the params MLflow holds for it
(spec settings, the resolved DeepSpeed config, optimizer, placement), the
values its runner reported in the header (DeepSpeed version and source, world
size, tokens per step, the model's shape) and a few tags (library versions,
device, GPU). Bookkeeping (repeat, run key) and how a run is watched
(timeouts) are no part of it.

A record can lack a value for two reasons, and they mean different things:

* **unknown**: the run never got there (cancelled or killed before its runner
  reported a header) or the record is older than the key. An unknown value
  never makes two runs differ: it is left out of every comparison.
* **empty**: the writer leaves a setting out when it is empty (no
  ``extra_args``, no ``env``, a DeepSpeed config key the run's config does not
  hold; ``dstui.execute.mlflow_params`` drops empty and inert values). A
  record that holds the run's settings and lacks such a key says the key was
  empty: ``""`` here, shown as "(unset)".

:func:`value` applies the rule for one key; everything that groups or compares
runs (:mod:`~dstui.analysis.grouping`, :mod:`~dstui.analysis.comparable`, the
report's settings tables) reads values through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dstui.analysis.rundata import RunData
from dstui.spec.settings import Settings
from dstui.tracking import tags as tag_keys

EMPTY = ""

# values the runner reports in its header record: absent until the header arrived
HEADER_PARAMS = frozenset({
    "deepspeed.version", "deepspeed.source", "tokens_per_step", "world_size", "peak_tflops",
    "model.parameters", "model.flops_per_token", "model.layers", "model.hidden", "model.heads",
    "model.kv_heads", "model.vocab",
})  # fmt: skip
# tags that say with what a run ran (written from the header too): part of its identity
IDENTITY_TAGS = (
    tag_keys.version("deepspeed"), tag_keys.version("torch"), tag_keys.version("transformers"),
    tag_keys.DEVICE, tag_keys.GPU_NAME,
)  # fmt: skip
# what differs between DeepSpeed revisions by nature: conditions are matched across revisions without them
REVISION_KEYS = frozenset({"deepspeed.version", "deepspeed.source", tag_keys.version("deepspeed")})
# bookkeeping and supervision: the same computation whatever their value
NOT_IDENTITY = frozenset({
    "revision", "repeat", "run_key", "hung_after_s", "stall_after_s", "max_runtime_s", "env_visible",
})  # fmt: skip
# settings the writer leaves out when empty (default None / [] / {}) or inert under the run's other
# settings (nvme_path without nvme offload, sp_mode and sp_check without sequence parallelism)
EMPTYABLE = frozenset(
    {name for name, f in Settings.model_fields.items() if f.get_default(call_default_factory=True) in (None, "", [], {})}
    | {"nvme_path", "sp_mode", "sp_check"}
)
EMPTYABLE_PREFIXES = ("ds.", "env.", "launcher.")


def recorded(run: RunData) -> dict[str, str]:
    """The run's identity values its record holds (params and identity tags), bookkeeping left out."""
    out = {k: v for k, v in run.known_params.items() if k not in NOT_IDENTITY}
    for key in IDENTITY_TAGS:
        if run.tags.get(key):
            out[key] = run.tags[key]
    return out


def holds_settings(run: RunData) -> bool:
    """The record holds the run's settings (so a missing empty-able key means empty, not unknown)."""
    return any(k not in HEADER_PARAMS for k in run.known_params)


def value(run: RunData, key: str, rec: dict[str, str] | None = None) -> str | None:
    """The run's value of ``key``: as recorded, :data:`EMPTY` where absence means empty, None when unknown."""
    rec = recorded(run) if rec is None else rec
    if key in rec:
        return rec[key]
    if key in HEADER_PARAMS or key in IDENTITY_TAGS or key in NOT_IDENTITY:
        return None
    if run.kind == "command" and key in run.params:  # a command run's dstui defaults: not what it ran
        return None
    if (key in EMPTYABLE or key.startswith(EMPTYABLE_PREFIXES)) and holds_settings(run):
        return EMPTY
    return None


def known(run: RunData, keys: Iterable[str]) -> dict[str, str]:
    """The run's known values of ``keys`` (unknown ones left out)."""
    rec = recorded(run)
    out = {}
    for k in keys:
        v = value(run, k, rec)
        if v is not None:
            out[k] = v
    return out


def keys_of(runs: Iterable[RunData]) -> set[str]:
    """Every identity key any of the runs records."""
    keys: set[str] = set()
    for r in runs:
        keys.update(recorded(r))
    return keys


def agree(a: dict[str, str], b: dict[str, str]) -> bool:
    """Two sets of known values agree on every key both know."""
    return all(a[k] == b[k] for k in a.keys() & b.keys())


def merged(runs: Sequence[RunData], keys: Iterable[str] | None = None) -> dict[str, str]:
    """What a group of runs that agree ran with: each key's known value (first known wins)."""
    keys = keys_of(runs) if keys is None else set(keys)
    out: dict[str, str] = {}
    for r in runs:
        for k, v in known(r, keys).items():
            out.setdefault(k, v)
    return out


def common_and_varying(runs: Sequence[RunData]) -> tuple[dict[str, str], list[str]]:
    """Settings every run that records them shares (non-empty), and the names of those with 2+ known values.

    ``ds.*`` keys are left out (the report shows each run's ds_config whole),
    and so are the identity tags (the report's Versions and Hardware tables
    show them). An unknown value is no value: a run cancelled before its
    runner reported the model's shape does not make ``model.heads`` vary.
    """
    keys = {k for k in keys_of(runs) if not k.startswith("ds.") and k not in IDENTITY_TAGS}
    seen: dict[str, set[str]] = {k: set() for k in keys}
    for r in runs:
        for k, v in known(r, keys).items():
            seen[k].add(v)
    common = {k: next(iter(vs)) for k, vs in sorted(seen.items()) if len(vs) == 1 and EMPTY not in vs}
    varying = sorted(k for k, vs in seen.items() if len(vs) > 1)
    return common, varying


def not_recorded(runs: Sequence[RunData], key: str) -> int:
    """How many of the runs do not record ``key`` (its value unknown to their record)."""
    return sum(1 for r in runs if value(r, key) is None)
