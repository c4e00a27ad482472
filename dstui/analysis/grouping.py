"""Which runs are repeats of one condition: grouped by what they ran, never by what a record lacks.

A condition's name says what the spec meant; it does not say what ran. The
same name in two batches of an experiment can stand for different settings
(``steps: 300`` then ``steps: 200``, a DeepSpeed upgrade under ``installed``),
and a run cancelled before it started ran nothing at all. So:

* runs that never started (:attr:`RunData.started`) are in no condition:
  they are listed with their reason and nothing else;
* the started runs of one condition name are split by their identity
  (:mod:`dstui.analysis.identity`): two runs are repeats of one condition
  only if no key has two different known values. A value a record lacks
  (unknown) never splits them;
* when a name splits, each part's label names the settings that tell them
  apart (``z1 (steps=200)``), and a note says so;
* a usable run pooled with others whose records know more than its own
  (an older record) gets a note naming what it lacks, so the pooling is said.

Grouping is in two stages so that a revision comparison matches like with
like: first the condition without the DeepSpeed-specific keys
(:data:`~dstui.analysis.identity.REVISION_KEYS`) gives ``condition_label``,
then each revision within it (and a changed DeepSpeed under one revision
name) gives ``label``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dstui.analysis.identity import EMPTY, REVISION_KEYS, agree, keys_of, known
from dstui.analysis.rundata import RunData

SHOWN_KEYS = 2  # settings named in a split label
SHOWN_VALUE = 40  # characters of a value in a label
NOT_STARTED = " (not started)"  # the label of a run that never started: in no condition


class _Cluster:
    """Runs that agree on every key they know, and the values they know together."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.members: list[int] = []

    def add(self, i: int, vals: dict[str, str]) -> None:
        self.members.append(i)
        for k, v in vals.items():
            self.values.setdefault(k, v)


def split(runs: Sequence[RunData], exclude: Iterable[str] = ()) -> list[tuple[list[RunData], dict[str, str]]]:
    """The runs as groups that agree on every known identity value (keys in ``exclude`` aside).

    Runs whose records know most are placed first, so a sparse record joins
    the group it agrees with instead of founding one; where it agrees with
    several, it joins the one it shares most known keys with (the first on a
    tie). Groups come in the order of their first run, runs in input order.
    """
    keys = keys_of(runs) - set(exclude)
    vals = [known(r, keys) for r in runs]
    clusters: list[_Cluster] = []
    for i in sorted(range(len(runs)), key=lambda i: -len(vals[i])):
        fits = [c for c in clusters if agree(vals[i], c.values)]
        if fits:
            max(fits, key=lambda c: len(vals[i].keys() & c.values.keys())).add(i, vals[i])
        else:
            c = _Cluster()
            c.add(i, vals[i])
            clusters.append(c)
    clusters.sort(key=lambda c: min(c.members))
    return [([runs[i] for i in sorted(c.members)], c.values) for c in clusters]


def _show(v: str) -> str:
    if v == EMPTY:
        return "(unset)"
    return v if len(v) <= SHOWN_VALUE else v[: SHOWN_VALUE - 1] + "…"


def telling_keys(values: Sequence[dict[str, str]]) -> list[str]:
    """The keys whose known values differ between groups, settings before what the runner reported."""
    keys = {k for v in values for k in v}
    differ = [k for k in keys if len({v[k] for v in values if k in v}) > 1]
    return sorted(differ, key=lambda k: ("." in k, k))


def _suffixes(values: Sequence[dict[str, str]]) -> list[str]:
    """`` (steps=200)`` per group: the settings that tell it from the others of its name."""
    if len(values) < 2:
        return [""] * len(values)
    keys = telling_keys(values)
    out = []
    for i, v in enumerate(values):
        shown = [f"{k}={_show(v[k])}" for k in keys if k in v]
        more = ", …" if len(shown) > SHOWN_KEYS else ""
        out.append(f" ({', '.join(shown[:SHOWN_KEYS])}{more})" if shown else f" (#{i + 1})")
    return out


def _by(runs: Iterable[RunData], attr: str) -> dict[str, list[RunData]]:
    out: dict[str, list[RunData]] = {}
    for r in runs:
        out.setdefault(getattr(r, attr), []).append(r)
    return out


def _name_parts(name: str, members: Sequence[RunData], exclude: Iterable[str],
                splits: dict[str, list[str]]) -> list[tuple[str, list[RunData], dict[str, str]]]:  # fmt: skip
    """Split one name's runs; the labels of the parts (the name when it does not split).

    A split is recorded in ``splits`` (what differed -> the names split by
    it), so names that split alike share one note.
    """
    parts = split(members, exclude)
    if len(parts) > 1:
        keys = telling_keys([v for _, v in parts])
        shown = "; ".join(f"{k}: " + " / ".join(dict.fromkeys(_show(v[k]) for _, v in parts if k in v))
                          for k in keys[:3])  # fmt: skip
        detail = f"ran with different settings ({shown}{'; ...' if len(keys) > 3 else ''}): reported as {len(parts)} conditions"
        splits.setdefault(detail, []).append(name)
    return [(name + sfx, rs, v) for sfx, (rs, v) in zip(_suffixes([v for _, v in parts]), parts, strict=True)]


def _pooling_notes(label: str, members: Sequence[RunData], values: dict[str, str]) -> list[str]:
    """A usable run whose record lacks values the others of its condition know: say it was pooled."""
    out = []
    for r in members:
        if not r.usable or not r.stats.get("points"):  # only a run whose numbers feed the figures
            continue
        lacking = sorted(set(values) - set(known(r, values)))
        if lacking:
            shown = ", ".join(lacking[:4]) + (" ..." if len(lacking) > 4 else "")
            out.append(f"{label}: run {r.run_name} ({r.batch or 'no batch'}) records no {shown}; pooled with the "
                       "other runs of the condition on the values it does record.")  # fmt: skip
    return out


def assign_labels(runs: Sequence[RunData]) -> list[str]:
    """Set every run's ``condition_label`` and ``label``; return notes on what was split or pooled and why.

    Runs that never started are labelled ``<condition> (not started)``: they
    belong to no condition, and a table that lists them must not read as if a
    condition of that name had them.
    """
    started = [r for r in runs if r.started]
    several = len({r.revision for r in started}) > 1
    splits: dict[str, list[str]] = {}
    pooled: list[str] = []
    for name, members in _by(started, "condition").items():
        for cond_label, rs, _ in _name_parts(name, members, REVISION_KEYS, splits):
            for r in rs:
                r.condition_label = cond_label
    for cond_label, members in _by(started, "condition_label").items():
        for revision, rs in _by(members, "revision").items():
            base = f"{cond_label} @ {revision}" if several else cond_label
            for label, part, values in _name_parts(base, rs, (), splits):
                pooled += _pooling_notes(label, part, values)
                for r in part:
                    r.label = label
    for r in runs:
        if not r.started:
            r.condition_label = r.condition
            r.label = (f"{r.condition} @ {r.revision}" if several else r.condition) + NOT_STARTED
    return [f"{', '.join(names)}: {'its' if len(names) == 1 else 'their'} runs {detail}{'' if len(names) == 1 else ' each'}, "
            "never as repeats of one." for detail, names in splits.items()] + pooled  # fmt: skip
