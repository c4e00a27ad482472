"""Experiment specs: typed models, matrix expansion, readable names, run keys (the front door).

A spec is a YAML file with base ``settings``, ``axes`` whose cartesian product
gives conditions, an ``exclude`` list, explicit named ``conditions``,
``repeats`` and ``revisions``. :func:`expand` turns it into one
:class:`RunSpec` per condition x revision x repeat.

The code lives in rooms of its own, re-exported here so that
``from dstui.spec.models import X`` keeps working:

- :mod:`~dstui.spec.settings`: :class:`Settings` (one condition) and the launcher options;
- :mod:`~dstui.spec.experiment`: the spec file's models and :class:`RunSpec`;
- :mod:`~dstui.spec.loading`: reading, validating and writing spec files;
- :mod:`~dstui.spec.expand`: axes x conditions x revisions x repeats -> RunSpecs.
"""

from __future__ import annotations

from dstui.spec.expand import MAX_RUNS, conditions, expand, expand_file, short_name
from dstui.spec.experiment import Condition, ExperimentSpec, Guard, Revision, RunSpec, SlurmOptions
from dstui.spec.loading import (
    MAX_SPEC_BYTES,
    dump_spec,
    load_spec,
    parse_spec,
    read_spec_text,
    save_spec,
)
from dstui.spec.settings import (
    SETTING_NAMES,
    SUPERVISION_ONLY,
    Dtype,
    Kind,
    Launcher,
    MetricsFormat,
    Offload,
    Settings,
    SpMode,
)

__all__ = [
    "MAX_RUNS", "MAX_SPEC_BYTES", "SETTING_NAMES", "SUPERVISION_ONLY",
    "Condition", "Dtype", "ExperimentSpec", "Guard", "Kind", "Launcher", "MetricsFormat", "Offload",
    "Revision", "RunSpec", "Settings", "SlurmOptions", "SpMode",
    "conditions", "dump_spec", "expand", "expand_file", "load_spec", "parse_spec", "read_spec_text",
    "save_spec", "short_name",
]  # fmt: skip
