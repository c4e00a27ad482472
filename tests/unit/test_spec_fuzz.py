"""Fuzzed specs: any YAML a user can write ends in runs or in a message, never a traceback.

The counts tried/survived are written to docs/RELIABILITY.md by hand from the
output of `pytest tests/test_spec_fuzz.py -s`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import dstui
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstui.core.errors import DstuiError
from dstui.execute import batch
from dstui.spec.settings import SETTING_NAMES

# one xdist worker runs the module in order: test_report_fuzz_counts reads the counts the fuzz test leaves
pytestmark = pytest.mark.xdist_group("spec-fuzz")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=10),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["none", "cpu", "nvme", "fp32", "bf16", "tiny-llama", "", "x" * 50, "$(touch /tmp/pwned)"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
keys = st.sampled_from([*SETTING_NAMES, "stage", "zero", "bogus"])
settings_maps = st.dictionaries(keys, values, max_size=6)

specs = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["fuzz", "", "a/b"]), st.text(max_size=10))},
    optional={
        "settings": settings_maps,
        "axes": st.dictionaries(keys, st.lists(values, max_size=3), max_size=3),
        "exclude": st.lists(settings_maps, max_size=2),
        "conditions": st.lists(st.fixed_dictionaries({"name": st.text(max_size=6)}, optional={"zero_stage": values, "micro_batch": values}), max_size=2),
        "repeats": values,
        "revisions": st.lists(st.dictionaries(st.sampled_from(["name", "pypi", "git", "ref", "path", "installed"]), values, max_size=3), max_size=2),
        "unknown_top": values,
    },
)

COUNTS = {"tried": 0, "valid": 0, "rejected": 0}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=specs)
def test_fuzzed_specs_are_runs_or_messages(tmp_path_factory, data: dict) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    COUNTS["tried"] += 1
    try:
        # DeepSpeed's validation is covered elsewhere; here the spec layer is fuzzed fast
        p = batch.plan(path, validate=False, resolve_revisions=False)
    except DstuiError as e:
        COUNTS["rejected"] += 1
        assert str(e).startswith(f"{path.resolve()}: ") and "\n" not in str(e), str(e)  # every spec error names the file
        return
    COUNTS["valid"] += 1
    assert p.runs and all(r.name and r.key for r in p.runs)


def test_report_fuzz_counts() -> None:
    if COUNTS["tried"] == 0:
        pytest.skip("counts exist only after test_fuzzed_specs_are_runs_or_messages ran")
    print(f"\nspec fuzz: {COUNTS}")
    assert COUNTS["tried"] >= 300, COUNTS
    assert COUNTS["rejected"] + COUNTS["valid"] == COUNTS["tried"]


@pytest.mark.e2e  # starts supervisors / the CLI in subprocesses
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=specs)
def test_fuzzed_specs_through_the_cli_launch_nothing(tmp_path_factory, data: dict) -> None:
    home = tmp_path_factory.mktemp("cli")
    path = home / "spec.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    proc = dstui("run", "--dry-run", str(path), env={"DSTUI_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home}/m.db"})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 2)
    assert not (home / "runs").exists() and not Path(home / "m.db").exists()


raw_specs = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda t: ("name: " + t + "\n").encode("utf-16"), st.text(max_size=10)),
    st.builds(lambda b: b"name: x\nconditions: [{name: " + b + b"}]\n", st.binary(max_size=20)),
    st.sampled_from([b"name: x\nrepeats: 100000000\n", b"name: ../../x\n", b"name: x\nconditions: [{name: a}, {name: a}]\n"]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=raw_specs)
def test_raw_bytes_and_hostile_names_are_runs_or_one_line(tmp_path_factory, raw: bytes) -> None:
    path = tmp_path_factory.mktemp("raw") / "spec.yaml"
    path.write_bytes(raw)
    try:
        p = batch.plan(path, validate=False, resolve_revisions=False)
    except DstuiError as e:
        assert str(e).strip() and "\n" not in str(e)
        return
    from dstui.core.names import problem

    assert all(problem(r.name, max_len=220) is None for r in p.runs)
