"""Saving a spec changes only the edited keys: comments, order and layout of the rest stay byte for byte.

(One indentation per file: ruamel.yaml writes one mapping indent and one sequence indent, guessed
from the file, so a file that mixes indents gets the first one it uses.)
"""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dstui.core.errors import SpecError
from dstui.spec.loading import is_shipped, save_spec_text, shipped_spec_dirs, updated_text

COMMENTED = """\
# A spec with comments everywhere a user puts them.
name: commented   # the experiment
description: "quoted, kept as written"
settings:
  model: tiny-llama      # a preset
  lr: 1e-4               # PyYAML reads this as a string: left alone
  micro_batch: 2
  steps: 8   # short
  flag_word: 'yes'

# the grid
axes:
  zero_stage: [0, 1, 2]    # flow style
  seq_length:
    - 64
    - 128
exclude:
  - {zero_stage: 0, seq_length: 128}   # no need
repeats: 1
# trailing comment
"""


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    a, b = before.splitlines(), after.splitlines()
    assert len(a) == len(b), after
    return [(x, y) for x, y in zip(a, b, strict=True) if x != y]


def test_one_scalar_edit_changes_one_line_only() -> None:
    data = yaml.safe_load(COMMENTED)
    data["settings"]["micro_batch"] = 4
    out = updated_text(COMMENTED, data)
    assert changed_lines(COMMENTED, out) == [("  micro_batch: 2", "  micro_batch: 4")]
    assert yaml.safe_load(out) == data


def test_unchanged_mapping_gives_the_same_bytes() -> None:
    assert updated_text(COMMENTED, yaml.safe_load(COMMENTED)) == COMMENTED


def test_flow_list_edit_keeps_its_style_and_comment() -> None:
    data = yaml.safe_load(COMMENTED)
    data["axes"]["zero_stage"] = [1, 2, 3]
    out = updated_text(COMMENTED, data)
    [(old, new)] = changed_lines(COMMENTED, out)
    assert new.startswith("  zero_stage: [1, 2, 3]") and new.endswith("# flow style")


def test_added_and_removed_keys_keep_the_comments_around_them() -> None:
    data = yaml.safe_load(COMMENTED)
    data["settings"]["torch_adam"] = True
    data["settings"]["ds_overrides"] = {"zero_optimization": {"reduce_bucket_size": 1000}}
    del data["settings"]["steps"]
    data["conditions"] = [{"name": "fast", "micro_batch": 8}]
    data["settings"]["lr"] = 1e-05  # a new float: written so PyYAML reads a float back
    out = updated_text(COMMENTED, data)
    assert yaml.safe_load(out) == data
    comments = [ln.split("#", 1)[1] for ln in COMMENTED.splitlines() if "#" in ln and "steps" not in ln]
    for c in comments:
        assert c in out, c
    # the full-line comments still come before what they came before
    assert out.index("# the grid") < out.index("axes:")
    assert out.rstrip().endswith("# trailing comment")
    assert out.index("# the grid") > out.index("torch_adam: true")  # new settings stay inside settings


def test_new_strings_that_pyyaml_would_misread_are_quoted() -> None:
    data = yaml.safe_load(COMMENTED)
    data["settings"]["dataset"] = "on"
    data["settings"]["nvme_path"] = "1e3"
    out = updated_text(COMMENTED, data)
    assert yaml.safe_load(out)["settings"]["dataset"] == "on"
    assert yaml.safe_load(out)["settings"]["nvme_path"] == "1e3"


def test_no_original_writes_plain_yaml() -> None:
    data = {"name": "fresh", "settings": {"steps": 3}}
    assert yaml.safe_load(updated_text(None, data)) == data


def test_a_file_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(SpecError, match="not a YAML mapping"):
        updated_text("- a\n- b\n", {"name": "x"})


def test_a_key_given_twice_is_refused_not_a_traceback() -> None:
    text = "name: a\nsettings: {steps: 3}\nsettings: {steps: 4}\n"  # PyYAML takes the last, ruamel refuses
    with pytest.raises(SpecError, match="cannot keep this file's layout"):
        updated_text(text, {"name": "b", "settings": {"steps": 4}})


def test_shipped_specs_are_recognised(tmp_path) -> None:  # noqa: ANN001
    shipped = shipped_spec_dirs()[0] / "smoke.yaml"
    assert shipped.is_file() and is_shipped(shipped)
    mine = tmp_path / "smoke.yaml"
    save_spec_text(mine, "name: smoke\n")
    assert not is_shipped(mine) and mine.read_text() == "name: smoke\n"


SETTING_KEYS = ("model", "micro_batch", "steps", "flag_word")
values = st.one_of(
    st.integers(-1000, 10**6),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20),
)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(SETTING_KEYS), value=values)
def test_any_single_setting_edit_reads_back_and_leaves_other_lines(key: str, value: object) -> None:
    """Whatever value a user types into one setting, the file reads back as the edit and only that line moves."""
    data = yaml.safe_load(COMMENTED)
    edited = copy.deepcopy(data)
    edited["settings"][key] = value
    out = updated_text(COMMENTED, edited)
    assert yaml.safe_load(out) == edited
    before = [ln for ln in COMMENTED.splitlines() if not ln.lstrip().startswith(f"{key}:")]
    after = [ln for ln in out.splitlines() if not ln.lstrip().startswith(f"{key}:")]
    assert before == after
