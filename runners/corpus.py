"""Training data for the runners: byte tokens or a tokenizer, packing, per-rank shards.

Split from common.py so model, device and process helpers stay apart from the
data pipeline. Heavy imports (torch, datasets, transformers) stay inside functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from common import TINY_CORPUS, RunnerError, is_preset

from dstui.core import model_folder


def byte_tokens(text: str | bytes, vocab: int) -> Any:
    """Token = byte value: no tokenizer download, fits any vocabulary of 256 or more."""
    import torch

    if vocab < 256:
        raise RunnerError(
            f"byte-level tokens need a vocabulary of at least 256 (the model has {vocab})"
        )
    data = text.encode("utf-8") if isinstance(text, str) else text
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def _tokenizer(name: str) -> Any | None:
    """The model's own tokenizer; None (byte tokens) for presets, config-only folders and hub models without one.

    A local folder without tokenizer files (dstui.core.model_folder) trains on
    bytes: transformers 5 would "load" an empty tokenizer from it. A folder that
    has tokenizer files must load them; failing that is the user's to fix, not
    a silent switch to bytes.
    """
    if is_preset(name):
        return None
    local = model_folder.is_local_folder(name)
    if local and not model_folder.tokenizer_files(name):
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, KeyError) as e:
        if local:
            raise RunnerError(f"model {name!r}: its tokenizer cannot be loaded: {_first_line(e)}") from None
        return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def checked_ids(ids: Any, *, model_name: str, vocab: int) -> Any:
    """``ids`` if a model of ``vocab`` tokens can train on them; else one line naming the model and why.

    Without this an empty stream died inside the data pipeline as
    ``RuntimeError: max(): Expected reduction dim ...`` and an id beyond the
    vocabulary as a device-side index error.
    """
    if ids.numel() == 0:
        raise RunnerError(
            f"model {model_name!r}: its tokenizer yields no tokens for the dataset's text (an empty vocabulary?)"
        )
    top = int(ids.max())
    if top >= vocab:
        raise RunnerError(
            f"model {model_name!r}: its tokenizer yields token id {top}, beyond the model's vocabulary ({vocab})"
        )
    return ids


def _hf_split(percent: float) -> str:
    pct = int(percent) if float(percent).is_integer() else percent
    return f"train[:{pct}%]"


def load_tokens(
    dataset: str,
    *,
    dataset_config: str | None,
    percent: float,
    model_name: str,
    vocab: int,
    seq_length: int,
    samples_needed: int,
    seed: int,
) -> tuple[Any, str]:
    """A flat token stream and a short description of where it came from."""
    import torch

    if dataset == "synthetic":
        gen = torch.Generator().manual_seed(seed)
        n = max(samples_needed, 1) * seq_length
        return torch.randint(0, vocab, (n,), generator=gen), f"synthetic ({vocab} tokens)"

    tok = _tokenizer(model_name)
    if dataset == "tiny-corpus":
        if not TINY_CORPUS.is_file():
            raise RunnerError(f"the shipped corpus is missing: {TINY_CORPUS}")
        text = TINY_CORPUS.read_text(encoding="utf-8")
        text = text[: max(1, int(len(text) * percent / 100.0))]
        if tok is None:
            return byte_tokens(text, vocab), "tiny-corpus (bytes)"
        ids = torch.tensor(tok(text)["input_ids"], dtype=torch.long)
        return checked_ids(ids, model_name=model_name, vocab=vocab), f"tiny-corpus ({model_name} tokenizer)"

    # Any other name is a Hugging Face dataset. This needs the hub (or its
    # cache) and so cannot run in the offline CI, but it is what users run.
    try:
        import datasets
    except ImportError:
        raise RunnerError(
            "the 'datasets' package is needed for HF datasets; pip install datasets"
        ) from None
    split = _hf_split(percent)
    try:
        ds = datasets.load_dataset(dataset, dataset_config, split=split)
    except Exception as e:  # noqa: BLE001 - datasets raises many types; all mean "cannot load"
        raise RunnerError(
            f"cannot load dataset '{dataset}' ({dataset_config}, {split}): {e}"
        ) from None
    column = (
        "text"
        if "text" in ds.column_names
        else next(
            (c for c, f in ds.features.items() if getattr(f, "dtype", None) == "string"), None
        )
    )
    if column is None:
        raise RunnerError(f"dataset '{dataset}' has no text column (columns: {ds.column_names})")
    texts = [t for t in ds[column] if t]
    if tok is None:
        return byte_tokens("\n".join(texts), vocab), f"{dataset} (bytes)"
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    ids: list[int] = []
    for out in tok(texts)["input_ids"]:
        ids.extend(out + eos)
    stream = torch.tensor(ids, dtype=torch.long)
    return checked_ids(stream, model_name=model_name, vocab=vocab), f"{dataset} ({model_name} tokenizer)"


def pack(tokens: Any, seq_length: int) -> Any:
    """Cut the stream into [n, seq_length] blocks (the tail that does not fill a block is dropped)."""
    n = tokens.numel() // seq_length
    if n == 0:
        raise RunnerError(
            f"the dataset has {tokens.numel()} tokens, fewer than one sequence of {seq_length}"
        )
    return tokens[: n * seq_length].view(n, seq_length).contiguous()


@dataclass
class ShardedBatches:
    """Deterministic micro batches of one data-parallel shard, epoch after epoch.

    ``epoch`` (0-based) is the epoch of the batch handed out last.

    The same split as torch's DistributedSampler (shuffle with seed+epoch,
    every ``replicas``-th index from ``rank``), done here so that any rank can
    reproduce any other rank's batches: the sequence-parallel check needs that.
    """

    blocks: Any
    micro_batch: int
    replicas: int
    rank: int
    seed: int
    epoch: int = 0

    def __post_init__(self) -> None:
        per_rank = self.blocks.shape[0] // self.replicas
        if per_rank < self.micro_batch:
            raise RunnerError(
                f"the dataset has {self.blocks.shape[0]} sequences: too few for {self.replicas} "
                f"data-parallel ranks x micro batch {self.micro_batch}"
            )
        self.batches_per_epoch = per_rank // self.micro_batch

    def _order(self, epoch: int) -> Any:
        import torch

        gen = torch.Generator().manual_seed(self.seed + epoch)
        perm = torch.randperm(self.blocks.shape[0], generator=gen)
        usable = (self.blocks.shape[0] // self.replicas) * self.replicas
        return perm[:usable][self.rank :: self.replicas]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import torch

        while True:
            order = self._order(self.epoch)
            for b in range(self.batches_per_epoch):
                idx = order[b * self.micro_batch : (b + 1) * self.micro_batch]
                ids = self.blocks[idx]
                pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids).contiguous()
                yield {"input_ids": ids, "labels": ids.clone(), "position_ids": pos}
            self.epoch += 1
