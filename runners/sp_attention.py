"""The attention function transformers calls, swapped per run: plain SDPA, Ulysses, ring, or a probed one.

The bundled models run with ``attn_implementation="sdpa"`` (runners/placement.py), so
``ALL_ATTENTION_FUNCTIONS["sdpa"]`` is the one place a sequence-parallel mode plugs in.
What sits there is a *slot*: a fixed function that calls whatever the slot holds now.
The sp-check's probe (runners/sp_probe.py) fills a slot with a capturing version for one
eager forward before training, then puts the plain function back before anything is
compiled: with and without the check, torch.compile traces the same slot holding the same function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sp_probe

ATTN = "sdpa"
_plain: list[Any] = []  # transformers' own SDPA attention, saved before anything wraps it
_slots: dict[str, Callable[..., Any]] = {}


def plain() -> Callable[..., Any]:
    """transformers' SDPA attention function, as it was before any mode wrapped it."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if not _plain:
        _plain.append(ALL_ATTENTION_FUNCTIONS[ATTN])
    return _plain[0]


def put(fn: Callable[..., Any]) -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    plain()
    ALL_ATTENTION_FUNCTIONS[ATTN] = fn


def current() -> Callable[..., Any]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[ATTN]


def slot(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A function that calls what slot ``name`` holds (``fn`` for now); see :func:`fill`."""
    _slots[name] = fn

    def entry(*args: Any, **kwargs: Any) -> Any:
        return _slots[name](*args, **kwargs)

    entry.__name__ = f"slot_{name}"
    return entry


def fill(name: str, fn: Callable[..., Any]) -> None:
    _slots[name] = fn


def reset() -> None:
    """Plain SDPA again: the no-SP runs of the sp-check must not exchange anything."""
    put(plain())


def probed(
    attention: Callable[..., Any], probe: sp_probe.Probe, inputs: tuple[str, dict[str, sp_probe.Place]],
    output: tuple[str, sp_probe.Place],
) -> Callable[..., Any]:
    """``attention`` with its Q/K/V captured as stage ``inputs[0]`` and its output as stage ``output[0]``."""
    stage_in, places = inputs
    stage_out, out_place = output

    def attend(module: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        for name, t in (("q", query), ("k", key), ("v", value)):
            probe.take(module, stage_in, name, t, places[name])
        out, weights = attention(module, query, key, value, *args, **kwargs)
        probe.take(module, stage_out, "o", out, out_place)
        return out, weights

    return attend


def reference(probe: sp_probe.Probe) -> None:
    """Plain SDPA behind a slot for the sp-check's no-SP runs, probed until ``probe.stop()``.

    The slot stays after the probe stops, as Ulysses' slots do: what is compiled later
    traces through the same function whether the capture ran or not.
    """
    sdpa = plain()
    whole = {name: sp_probe.Place(name) for name in "qkv"}
    put(slot("reference", probed(sdpa, probe, (sp_probe.REFERENCE, whole), (sp_probe.REFERENCE, sp_probe.Place("o")))))
    probe.on_stop(lambda: fill("reference", sdpa))
