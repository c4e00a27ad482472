"""Issue 31.3 on a GPU: local model folders as users make them, through ``dstui run``.

``prepare WORK`` writes two config-only folders in the shapes of Qwen2-0.5B and GPT-2 medium
(random init, no tokenizer: the run must train on byte tokens), a folder whose tokenizer yields no
token at all (it must be refused before launch), and the two specs that use them.
``summarize BATCH`` prints one line per run: state, data source, where the model was built, losses,
peak memory and the rank's phases. validate.sh's ``folders`` phase runs both around ``dstui run``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from model_folders import EMPTY_BPE, config_only, with_tokenizer  # noqa: E402

QWEN2_05B = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
             "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": True}  # fmt: skip
GPT2_MEDIUM = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 1024, "n_layer": 24, "n_head": 16,
               "n_positions": 1024}  # fmt: skip
SETTINGS = ("{dataset: tiny-corpus, seq_length: 1024, micro_batch: 4, steps: 3, warmup_steps: 1, "
            "dtype: bf16, gpus: 1, seed: 5}")  # fmt: skip


def prepare(work: Path) -> None:
    models = work / "models"
    qwen = config_only(models / "qwen2-0.5b-shape", QWEN2_05B)
    gpt2 = config_only(models / "gpt2-medium-shape", GPT2_MEDIUM)
    empty = with_tokenizer(models / "empty-tokenizer", GPT2_MEDIUM, EMPTY_BPE)
    (work / "folders.yaml").write_text(
        f"name: folders\nsettings: {SETTINGS}\naxes:\n  model: [\"{qwen}\", \"{gpt2}\"]\n  zero_stage: [1, 3]\n")
    (work / "folders-refused.yaml").write_text(
        f"name: folders-refused\nsettings: {SETTINGS}\nconditions:\n  - {{name: empty, model: \"{empty}\"}}\n")


def summarize(batch: Path) -> None:
    for rd in sorted(p for p in batch.iterdir() if (p / "status.json").exists()):
        status = json.loads((rd / "status.json").read_text())
        metrics = rd / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        records = [json.loads(ln) for ln in lines if ln.startswith("{")]
        header = next((r for r in records if r.get("type") == "header"), {})
        steps = [r for r in records if r.get("type") == "step"]
        losses = [round(s["loss"], 4) for s in steps if "loss" in s]
        peaks = [s["mem_peak"] for s in steps if isinstance(s.get("mem_peak"), (int, float))]
        marks = next((r for r in reversed(records) if r.get("type") == "phases"), {})
        times = [(k, v) for k, v in marks.items() if k != "time" and isinstance(v, (int, float))]
        phases = {b[0]: round(b[1] - a[1], 2) for a, b in itertools.pairwise(times)}
        print(f"{rd.name}: {status.get('state')} {status.get('reason') or ''}".rstrip())
        print(f"  data: {header.get('data')}  model_init: {json.dumps(header.get('model_init'))}")
        print(f"  losses: {losses}  peak mem: {max(peaks) if peaks else None}")
        print(f"  seconds up to each mark from the one before: {json.dumps(phases)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare").add_argument("work", type=Path)
    sub.add_parser("summarize").add_argument("batch", type=Path)
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.work)
    else:
        summarize(args.batch)


if __name__ == "__main__":
    main()
