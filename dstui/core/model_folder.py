"""What a local model folder holds: a tokenizer, or a config only.

A folder with only ``config.json`` is the usual way to get a random-init model
of a given shape. transformers 5 still "loads" a tokenizer from such a folder
(an empty vocabulary: every text becomes zero tokens), so whether a folder has
a tokenizer is told by its files, the same way in the runner (which then trains
on byte tokens, as for presets) and in the check before launch.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Files any of which makes a folder's tokenizer: fast (tokenizers), slow BPE/WordPiece,
#: SentencePiece, tiktoken, or a tokenizer_config.json naming a class.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
TOKENIZER_SUFFIXES = (".tiktoken",)


def is_local_folder(model: str) -> bool:
    return Path(model).expanduser().is_dir()


def tokenizer_files(folder: str | Path) -> list[str]:
    """The tokenizer files in ``folder`` (sorted names); empty for a config-only folder."""
    path = Path(folder).expanduser()
    try:
        names = {p.name for p in path.iterdir() if p.is_file()}
    except OSError:
        return []
    return sorted(n for n in names if n in TOKENIZER_FILES or n.endswith(TOKENIZER_SUFFIXES))


def config_vocab(folder: str | Path) -> int | None:
    """``vocab_size`` of the folder's config.json (or of its ``text_config``); None when it does not say."""
    try:
        cfg = json.loads((Path(folder).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    for holder in (cfg, cfg.get("text_config")):
        if isinstance(holder, dict) and isinstance(holder.get("vocab_size"), int) and not isinstance(holder.get("vocab_size"), bool):
            return int(holder["vocab_size"])
    return None
