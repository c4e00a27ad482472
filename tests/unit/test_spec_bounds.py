"""Issue 40.5: a spec is read within bounds, by PyYAML and by ruamel.yaml alike.

Billion laughs, too many aliases, deep nesting and a spec whose settings would fill the
disk once repeated in every run's folder are each refused with one line naming the limit
(SpecError), never a traceback or a RecursionError. The property tests run both YAML
libraries over documents full of shared (anchored) values with small limits, so that
both sides of every limit are reached: what is accepted equals PyYAML's own reading, and
what is refused really passes the limit it names (counted independently, from the events).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO, fuzz_examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from dstui.core.errors import SpecError
from dstui.spec import bounded_yaml, expand
from dstui.spec.loading import load_spec, parse_spec, updated_text

sys.path.insert(0, str(REPO / "tests" / "programs"))
from yaml_bombs import AXES, HEAD, laughs  # noqa: E402


def spec_with(extra: str) -> str:
    return HEAD + extra


def test_billion_laughs_is_refused_by_both_yaml_readers(tmp_path: Path) -> None:
    text = spec_with(laughs())
    assert len(text) < 600
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=r"bomb.yaml: refused: the YAML stands for more than 100,000 values once its aliases are expanded \(at line \d+\)"):
        load_spec(path)
    with pytest.raises(bounded_yaml.SpecLimit):  # Compose saving the same file (ruamel's round trip)
        updated_text(text, {"name": "bomb"}, file=str(path))
    with pytest.raises(bounded_yaml.LimitPassed, match="100,000 values"):  # ruamel's own composer, on its own
        bounded_yaml.bound_round_trip(YAML()).load(text)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000 + "]" * 5000,
        "".join(f"{' ' * i}k{i}:\n" for i in range(3000)) + " " * 3000 + "v\n",
        "- " * 3000 + "x\n",
    ],
    ids=["flow", "block-mappings", "block-sequences"],
)
def test_deep_nesting_is_one_line_not_a_recursion_traceback(text: str) -> None:
    with pytest.raises(SpecError, match=r"^refused: the YAML nests deeper than 50 levels \(at line \d+\)$"):
        bounded_yaml.load(text)
    with pytest.raises(bounded_yaml.LimitPassed, match="nests deeper than 50"):
        bounded_yaml.bound_round_trip(YAML()).load(text)


def test_aliases_beyond_the_count_are_refused_and_a_few_merges_are_fine() -> None:
    many = "x: &x 1\n" + "".join(f"k{i}: *x\n" for i in range(101))
    with pytest.raises(SpecError, match=r"^refused: the YAML uses more than 100 aliases \(\*name\) \(at line 102\)$"):
        bounded_yaml.load(many)
    merged = spec_with("base: &base {steps: 2}\nconditions:\n" + "".join(f"  - {{<<: *base, name: c{i}}}\n" for i in range(30)))
    data = bounded_yaml.load(merged)
    data.pop("base")
    assert [s.steps for _, s in expand.conditions(parse_spec(data))] == [2] * 30


def test_a_spec_whose_settings_would_fill_the_run_folders_is_refused_before_any_condition_is_built() -> None:
    big = spec_with(AXES).replace("[echo, hi]", "[echo, " + "x" * 5000 + "]")
    with pytest.raises(SpecError, match=r"refused: the spec expands to 8000 runs holding \d+ MiB of settings in their folders; at most 32 MiB"):
        parse_spec(bounded_yaml.load(big))
    small = spec_with(AXES)
    assert len(expand.check_names(parse_spec(bounded_yaml.load(small)))) == 400  # 8000 runs of small settings: fine


# ---- property tests: both readers, both sides of every limit ----

LIMITS = {"MAX_ALIASES": 6, "MAX_DEPTH": 8, "MAX_NODES": 300}
SCALARS = st.one_of(st.integers(-5, 5), st.text(alphabet="abc xyz", max_size=4), st.booleans(), st.none())


@st.composite
def shared_documents(draw: Any) -> str:
    """YAML text whose values share sub-values (PyYAML writes anchors and aliases for them), at random depths."""
    first = draw(st.sampled_from([3, 100]))  # a long list: a few aliases of it pass the values limit
    pool: list[Any] = [draw(st.lists(SCALARS, min_size=first, max_size=first))]
    for _ in range(draw(st.integers(0, 14))):
        picks = [pool[draw(st.integers(0, len(pool) - 1))] for _ in range(draw(st.integers(1, 4)))]
        if draw(st.booleans()):
            picks.append(draw(SCALARS))
        pool.append(picks if draw(st.booleans()) else {f"k{i}": v for i, v in enumerate(picks)})
    doc: Any = pool[-1]
    for _ in range(draw(st.integers(0, 6))):
        doc = [doc] if draw(st.booleans()) else {"n": doc}
    return yaml.safe_dump(doc, default_flow_style=draw(st.sampled_from([None, True, False])))


def measured(text: str) -> dict[str, int]:
    """Aliases, depth and values-with-aliases-expanded, counted from PyYAML's events and node graph."""
    aliases = depth = level = 0
    for event in yaml.parse(text):
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
        elif isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            depth = max(depth, level + 1)
            level += isinstance(event, yaml.CollectionStartEvent)
        elif isinstance(event, yaml.CollectionEndEvent):
            level -= 1
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if id(node) not in sizes:
            if isinstance(node, yaml.MappingNode):
                sizes[id(node)] = 1 + sum(size(k) + size(v) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                sizes[id(node)] = 1 + sum(size(v) for v in node.value)
            else:
                sizes[id(node)] = 1
        return sizes[id(node)]

    root = yaml.compose(text)
    return {"MAX_ALIASES": aliases, "MAX_DEPTH": depth, "MAX_NODES": size(root) if root is not None else 0}


NAMES = {"aliases (*name)": "MAX_ALIASES", "nests deeper": "MAX_DEPTH", "values once": "MAX_NODES"}


@settings(max_examples=fuzz_examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=shared_documents())
def test_both_readers_accept_exactly_what_is_within_the_limits(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in LIMITS.items():
        monkeypatch.setattr(bounded_yaml, name, value)
    counts = measured(text)
    within = all(counts[name] <= LIMITS[name] for name in LIMITS)
    try:
        got = bounded_yaml.load(text)
    except SpecError as e:
        assert not within, (counts, str(e))
        passed = next(limit for word, limit in NAMES.items() if word in str(e))
        assert counts[passed] > LIMITS[passed], (counts, str(e))
        with pytest.raises(bounded_yaml.LimitPassed):
            bounded_yaml.bound_round_trip(YAML(typ="rt")).load(text)
        return
    assert within, counts
    assert got == yaml.safe_load(text)
    assert plain(bounded_yaml.bound_round_trip(YAML(typ="rt")).load(text)) == got  # ruamel reads it alike


def plain(value: Any) -> Any:
    """ruamel's round-trip containers as plain dicts and lists."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
