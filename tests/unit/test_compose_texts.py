"""Compose's YAML texts and comma lists: what a user types is read, checked against its field, or refused
with one line (a ValueError), never a traceback."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstui.tui import compose_model as cm
from dstui.tui import compose_texts as ct


def test_a_mapping_is_one_value_and_a_list_of_mappings_an_axis() -> None:
    assert ct.parse_yaml_field("ds_overrides", '{"a": {"b": 1}}') == [{"a": {"b": 1}}]
    assert ct.parse_yaml_field("ds_overrides", "- {a: 1}\n- {a: 2}\n") == [{"a": 1}, {"a": 2}]
    assert ct.parse_yaml_field("command", "[python, -c, 'print(1)']") == [["python", "-c", "print(1)"]]
    assert ct.parse_yaml_field("command", "- [a]\n- [b]\n") == [["a"], ["b"]]
    assert ct.parse_yaml_field("ds_overrides", "  ") == []


@pytest.mark.parametrize(
    ("field", "text", "why"),
    [
        ("ds_overrides", "{a: [1", "not valid YAML/JSON at line 1"),
        ("ds_overrides", "3", "ds overrides: "),
        ("launcher", "{launcher: nope}", "launcher"),
        ("ds_overrides", "[" * 5000 + "]" * 5000, "ds overrides"),
        ("ds_overrides", "a: 1\n" * 20000, "at most"),
    ],
)
def test_texts_that_do_not_fit_are_one_line_errors(field: str, text: str, why: str) -> None:
    with pytest.raises(ValueError, match=None) as e:
        ct.parse_yaml_field(field, text)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_exclusions_and_conditions_name_the_bad_item() -> None:
    assert ct.parse_exclusions("- {zero_stage: 0, offload: cpu}") == [{"zero_stage": 0, "offload": "cpu"}]
    with pytest.raises(ValueError, match="item 2: unknown setting 'zero'"):
        ct.parse_exclusions("- {zero_stage: 0}\n- {zero: 1}")
    with pytest.raises(ValueError, match="item 1: a mapping with a 'name'"):
        ct.parse_conditions("- {micro_batch: 4}")
    with pytest.raises(ValueError, match="'exclude' is not one"):
        ct.parse_run_options("exclude: []")


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=200))
def test_any_typing_is_read_or_refused_with_a_value_error(text: str) -> None:
    calls = [
        lambda: ct.parse_yaml_field("ds_overrides", text),
        lambda: ct.parse_yaml_field("command", text),
        lambda: ct.parse_yaml_field("launcher", text),
        lambda: ct.parse_exclusions(text),
        lambda: ct.parse_conditions(text),
        lambda: ct.parse_run_options(text),
        lambda: cm.parse_list("micro_batch", text),
        lambda: cm.parse_list("lr", text),
        lambda: cm.parse_list("dataset", text),
    ]
    for call in calls:
        try:
            call()
        except ValueError as e:
            assert str(e) and len(str(e)) < 1000
