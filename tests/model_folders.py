"""Local model folders as users make them (issue 31): config-only, or with a tokenizer that is broken.

Written by the tests themselves, tiny: 2 layers, hidden 64, a 512-token vocabulary (byte tokens fit).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN2 = {"model_type": "qwen2", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256, "tie_word_embeddings": False}  # fmt: skip
GPT2 = {"model_type": "gpt2", "vocab_size": 512, "n_embd": 64, "n_layer": 2, "n_head": 2, "n_positions": 256}

# tokenizers' JSON format: a BPE with no vocabulary and no unknown token drops every character
EMPTY_BPE = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
             "vocab": {}, "merges": []}  # fmt: skip
# every word is the unknown token, id 1000: beyond a 512-token model
UNK_1000 = {"type": "WordLevel", "vocab": {"[UNK]": 1000}, "unk_token": "[UNK]"}


def config_only(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def with_tokenizer(folder: Path, config: dict[str, Any], model: dict[str, Any]) -> Path:
    """A folder whose tokenizer.json has the given tokenizers ``model`` (whitespace pre-tokenizer)."""
    config_only(folder, config)
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None, "model": model}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return folder
