"""A spec's ``model:`` may be a local folder holding only config.json (issue 31).

Such a folder used to fail every run at data loading (transformers 5 "loads" an
empty tokenizer from it: ``RuntimeError: max(): Expected reduction dim ...``).
Now it trains on byte tokens and says so; a folder whose tokenizer yields no
tokens is refused before launch in one line. Real DeepSpeed, 1 gloo rank each.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import dstui
from model_folders import EMPTY_BPE, GPT2, QWEN2, config_only, with_tokenizer

from dstui.core.record_file import read_records
from dstui.core.rundir import list_batches

SPEC = """
    name: folders
    settings: {{dataset: tiny-corpus, seq_length: 32, micro_batch: 2, steps: 2, warmup_steps: 1,
                dtype: fp32, gpus: 1, seed: 3, torch_adam: true, zero_stage: {stage}}}
    conditions:
      - {{name: qwen2, model: "{qwen}"}}
      - {{name: gpt2, model: "{gpt2}"}}
"""


def test_config_only_folders_train_on_byte_tokens(home: Path) -> None:
    qwen = config_only(home / "models" / "qwen2-tiny", QWEN2)
    gpt2 = config_only(home / "models" / "gpt2-tiny", GPT2)
    spec = home / "folders.yaml"
    spec.write_text(textwrap.dedent(SPEC.format(qwen=qwen, gpt2=gpt2, stage=1)))
    proc = dstui("run", str(spec), timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (batch,) = list_batches(home / "runs")
    runs = {rd.name: rd for rd in batch.runs()}
    assert set(runs) == {"qwen2-r0", "gpt2-r0"}
    for name, rd in runs.items():
        assert rd.status()["state"] == "done", (name, rd.status().get("reason"))
        records = list(read_records(rd.metrics_file))
        (header,) = [r for r in records if r.get("type") == "header"]
        assert header["data"] == "tiny-corpus (bytes)", header["data"]  # as for presets
        losses = [r["loss"] for r in records if r.get("type") == "step" and "loss" in r]
        assert len(losses) == 2 and all(x == x and x > 0 for x in losses), records


def test_folder_whose_tokenizer_yields_nothing_is_refused_before_launch(home: Path) -> None:
    empty = with_tokenizer(home / "models" / "empty-tok", GPT2, EMPTY_BPE)
    spec = home / "empty.yaml"
    spec.write_text(textwrap.dedent(SPEC.format(qwen=empty, gpt2=empty, stage=0)))
    proc = dstui("run", str(spec), timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1, proc.stderr
    assert f"model '{empty}': its tokenizer yields no tokens" in errors[0]
    assert "Traceback" not in proc.stderr and "RuntimeError" not in proc.stderr
    assert list_batches(home / "runs") == []  # nothing laid out, nothing launched
