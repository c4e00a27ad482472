"""Tensor capture for the sp-check: Q/K/V and attention outputs of chosen layers at the first forward.

A :class:`Probe` is handed to the attention functions of one run (runners/ulysses.py,
runners/ring.py, or the plain SDPA of the no-SP reference, runners/sp_attention.py). Each
chosen layer's tensors are copied to host memory, each with its :class:`Place`: where in the
no-SP run's tensor of the same layer this rank's piece belongs (which tokens, which heads).
runners/sp_tensors.py compares the pieces with the reference there.

The capture never runs inside the training that is measured (:func:`capture`): before the
first step, on the engine just built and not compiled yet, one forward of step 1's first
micro batch runs eagerly without gradients, with the probe on; the probe is stopped, the
plain attention functions go back in their slots, and only then is the engine compiled and
trained. So a run compiles and measures the same graphs with and without ``--sp-check``
(the summary's ``dynamo_*`` counts say so): a capture inside a compiled step would add
graph breaks, and taking it out after step 1 a recompile (DeepCompile aborted in that
backward recompile, docs/gpu-validation/README.md section 8). The weights are the
initial ones and the batch is step 1's, so the captured tensors are those of step 1's forward.

A piece is taken once per layer, stage and part (a recompute under activation checkpointing
repeats the forward).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from common import RunnerError

# Reference layouts (HF's attention functions): q/k/v [batch, heads, tokens, dim],
# the attention output o [batch, tokens, heads, dim].
TOKEN_DIM = {"q": 2, "k": 2, "v": 2, "o": 1}
HEAD_DIM = {"q": 1, "k": 1, "v": 1, "o": 2}
# The stages in data-flow order: the verdict names the first (layer, stage) that differs.
STAGE_ORDER = ("shard", "exchanged", "attention", "returned")
REFERENCE = "full"


@dataclass(frozen=True)
class Place:
    """Where a rank's piece sits in the no-SP tensor ``base`` of the same layer.

    ``tokens``: (start, stop) spans of reference token indices, in the piece's order
    (None = every token); ``heads``: reference head indices in the piece's order (None = all).
    """

    base: str
    tokens: tuple[tuple[int, int], ...] | None = None
    heads: tuple[int, ...] | None = None

    def token_index(self) -> list[int] | None:
        if self.tokens is None:
            return None
        return [t for a, b in self.tokens for t in range(a, b)]


def parse_layers(text: str) -> list[int]:
    """``--sp-check-layers``: comma-separated layer indices, negative ones counted from the last."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise RunnerError(f"--sp-check-layers: not a comma-separated list of integers: {text!r}") from None
    if not out:
        raise RunnerError("--sp-check-layers: name at least one layer (e.g. 0,-1)")
    return out


def resolve_layers(wanted: list[int], n_layers: int) -> tuple[int, ...]:
    """The chosen layer indices as 0..n_layers-1, sorted, without repeats."""
    bad = [i for i in wanted if not -n_layers <= i < n_layers]
    if bad:
        raise RunnerError(f"--sp-check-layers {bad}: the model has {n_layers} layers (0..{n_layers - 1})")
    return tuple(sorted({i % n_layers for i in wanted}))


class Probe:
    """The pieces one run captured: ``pieces[(layer, stage, name)][part] = (host tensor, Place)``."""

    def __init__(self, wanted: list[int]) -> None:
        self.wanted = wanted
        self.layers: tuple[int, ...] = ()  # resolve() sets them once the model is known
        self.pieces: dict[tuple[int, str, str], dict[int, tuple[Any, Place]]] = {}
        # stage -> (words for the verdict, names of its tensors); set by the mode (ulysses.STAGES, ring.STAGES)
        self.stages: dict[str, tuple[str, str]] = {}
        self.active = True
        self._on_stop: list[Callable[[], None]] = []

    def take(self, module: Any, stage: str, name: str, tensor: Any, place: Place, part: int = 0) -> None:
        layer = getattr(module, "layer_idx", None)
        if not self.active or layer not in self.layers:
            return
        parts = self.pieces.setdefault((layer, stage, name), {})
        if part not in parts:  # the first forward's: a recompute (checkpointing) repeats it
            parts[part] = (tensor.detach().float().cpu(), place)

    def resolve(self, n_layers: int) -> None:
        self.layers = resolve_layers(self.wanted, n_layers)

    def on_stop(self, fn: Callable[[], None]) -> None:
        self._on_stop.append(fn)

    def stop(self) -> None:
        """End the capture and put the plain attention functions back (before the engine is compiled)."""
        if not self.active:
            return
        self.active = False
        for fn in self._on_stop:
            fn()


def capture(
    probe: Probe, forward: Callable[[dict[str, Any]], Any], batches: Iterator[dict[str, Any]], devices: list[int]
) -> Iterator[dict[str, Any]]:
    """One eager forward of the first batch without gradients, the probe on; then the probe stopped.

    Returns ``batches`` with that batch still first: training sees the same data in the same
    order. The random generators are restored afterwards, so the run draws what it would have
    drawn without the capture (``devices``: the accelerator indices whose generators to restore, none on a
    CPU). Every rank calls it (the forward has collectives).
    """
    import itertools

    import torch

    first = next(batches)
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        forward(dict(first))  # a copy: the loss pops what it reads (runners/ulysses.loss)
    probe.stop()
    return itertools.chain([first], batches)
