"""A model no runner could load is refused before launch (issue 20), in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstui.core.errors import SpecError
from dstui.execute.preflight import check_models, model_problem
from dstui.spec.models import expand, parse_spec


def test_presets_and_local_folders_pass(tmp_path: Path) -> None:
    assert model_problem("tiny-llama") is None
    (tmp_path / "config.json").write_text("{}")
    assert model_problem(str(tmp_path)) is None


def test_typos_and_missing_folders_are_named(tmp_path: Path) -> None:
    assert "not a preset" in (model_problem("tiny-lama") or "") and "tiny-llama" in (model_problem("tiny-lama") or "")
    assert "no such folder" in (model_problem(str(tmp_path / "nope")) or "")
    assert "has no config.json" in (model_problem(str(tmp_path)) or "")


def test_uncached_hub_id_offline_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert "not in the local Hugging Face cache" in (model_problem("nobody/no-such-model-xyz") or "")
    runs = expand(parse_spec({"name": "m", "conditions": [{"name": "c", "model": "nobody/no-such-model-xyz"}]}))
    with pytest.raises(SpecError) as e:
        check_models(runs, file="s.yaml")
    assert str(e.value).startswith("s.yaml: condition 'c': field 'model': model 'nobody/no-such-model-xyz'")


def test_command_runs_are_not_checked() -> None:
    runs = expand(parse_spec({"name": "m", "settings": {"kind": "command", "command": ["true"], "model": "zz"}}))
    check_models(runs, file=None)
