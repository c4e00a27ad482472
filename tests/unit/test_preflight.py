"""A model no runner could load is refused before launch (issue 20), in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import HEAVY
from model_folders import EMPTY_BPE, GPT2, QWEN2, UNK_1000, config_only, with_tokenizer

from dstui.core import model_folder
from dstui.core.errors import SpecError
from dstui.execute.preflight import check_models, model_problem, tokenizer_problem
from dstui.spec.expand import expand
from dstui.spec.loading import parse_spec


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


# -- local folders' tokenizers (issue 31) --------------------------------------------------------

def test_config_only_folder_needs_no_tokenizer_check(tmp_path: Path) -> None:
    folder = config_only(tmp_path / "qwen", QWEN2)
    assert model_folder.tokenizer_files(folder) == []
    assert tokenizer_problem(str(folder), "tiny-corpus") is None  # byte tokens: nothing to try


@HEAVY
def test_tokenizer_that_yields_nothing_or_too_large_ids_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSTUI_CACHE", str(tmp_path / "cache"))
    empty = with_tokenizer(tmp_path / "empty", GPT2, EMPTY_BPE)
    runs = expand(parse_spec({"name": "m", "conditions": [{"name": "c", "model": str(empty)}]}))
    with pytest.raises(SpecError) as e:
        check_models(runs, file="s.yaml")
    line = str(e.value)
    assert line.startswith(f"s.yaml: condition 'c': field 'model': model '{empty}': its tokenizer yields no tokens")
    assert "\n" not in line
    big = with_tokenizer(tmp_path / "big", GPT2, UNK_1000)
    assert "token id 1000, beyond the model's vocabulary (512" in (tokenizer_problem(str(big), "tiny-corpus") or "")
    assert tokenizer_problem(str(big), "synthetic") is None  # synthetic data never meets the tokenizer
    # refusals are not kept: asked again once the folder is fixed
    assert not list((tmp_path / "cache").rglob("tokenizer-probe/*"))


@HEAVY
def test_a_working_tokenizer_passes_and_its_answer_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSTUI_CACHE", str(tmp_path / "cache"))
    ok = with_tokenizer(tmp_path / "ok", GPT2, {"type": "WordLevel", "vocab": {"[UNK]": 0, "the": 1}, "unk_token": "[UNK]"})
    assert tokenizer_problem(str(ok), "tiny-corpus") is None
    assert len(list((tmp_path / "cache").rglob("tokenizer-probe/*"))) == 1
