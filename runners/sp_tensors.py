"""The sp-check's tensor comparison: every captured piece against the no-SP run's tensor where it belongs.

For each chosen layer and stage (runners/sp_probe.py) the SP run's pieces -- Q/K/V as each
rank holds them before the exchange, after it, the attention output, and (Ulysses) the
output after the reverse exchange -- are compared with the slices of the no-SP run's
tensors of the same layer that they claim to be (their Place). The measure is the
relative difference ||sp - ref|| / ||ref|| over all pieces of the stage on all ranks: the
squared sums are added over the ranks, which gives the number gathering the whole tensor
would give, without holding it on one rank.

The tolerance, per layer and tensor, is the larger of

* ``NOISE_FACTOR`` times the measured noise: the relative difference of the no-SP
  twin run (runners/sp_check.py) from the reference at that layer and tensor. Every
  capture is an eager forward before training (runners/sp_probe.capture), the twin's
  too, so this is the noise of an eager repeat: zero where the kernels are deterministic;
* the dtype floor ``DTYPE_FLOOR``: four machine epsilons for bf16 and fp16 (a stored
  activation is rounded once, to half an epsilon; other kernels, other blocking and a
  few layers of that add up), 1e-5 in fp32 (order of sums only).

A wrong head split or a shard at the wrong offset moves the relative difference to order 1
at the first layer it touches, far beyond both terms. The verdict names the first layer and
stage (in data-flow order) outside its tolerance, and the token and head of its largest
difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sp_probe import HEAD_DIM, REFERENCE, STAGE_ORDER, TOKEN_DIM, Place, Probe

NOISE_FACTOR = 4.0
DTYPE_FLOOR = {"bf16": 4 * 2.0**-7, "fp16": 4 * 2.0**-10, "fp32": 1e-5}
# columns of one key's statistics: squared difference, squared reference, largest |difference|,
# its token and head, number of pieces
_COLS = 6


@dataclass
class Row:
    """One layer, stage and tensor of the SP run against the reference."""

    layer: int
    stage: str
    name: str
    label: str
    rel: float
    tol: float
    token: int | None = None
    head: int | None = None
    captured: bool = True

    @property
    def ok(self) -> bool:
        return self.captured and self.rel <= self.tol

    def words(self) -> str:
        where = f" (largest at token {self.token}, head {self.head})" if self.token is not None else ""
        return f"layer {self.layer}, {self.name} {self.label}: relative difference {self.rel:.3g}, tolerance {self.tol:.2g}{where}"


def expected(probe: Probe) -> list[tuple[int, str, str]]:
    """Every (layer, stage, tensor) the SP run should have captured, in data-flow order."""
    stages = [s for s in STAGE_ORDER if s in probe.stages]
    return [(layer, s, n) for layer in probe.layers for s in stages for n in probe.stages[s][1]]


def _select(ref: Any, place: Place) -> tuple[Any, list[int] | None, list[int] | None]:
    """The slice of ``ref`` a piece claims to be, and the reference indices of its tokens and heads."""
    import torch

    tokens, heads = place.token_index(), list(place.heads) if place.heads is not None else None
    sel = ref
    if tokens is not None:
        sel = sel.index_select(TOKEN_DIM[place.base], torch.tensor(tokens))
    if heads is not None:
        sel = sel.index_select(HEAD_DIM[place.base], torch.tensor(heads))
    return sel, tokens, heads


def _piece_stats(parts: dict[int, tuple[Any, Place]], ref_of: Any) -> list[float]:
    """This rank's statistics of one key: its pieces against the reference (see _COLS)."""
    import torch

    sq_diff = sq_ref = 0.0
    worst, token, head = -1.0, -1.0, -1.0
    for tensor, place in parts.values():
        ref = ref_of(place.base)
        if ref is None:
            return [0.0, 0.0, -1.0, -1.0, -1.0, 0.0]  # no reference: counted as not captured
        sel, tokens, heads = _select(ref, place)
        diff = tensor.reshape(sel.shape) - sel
        sq_diff += float(diff.double().square().sum())
        sq_ref += float(sel.double().square().sum())
        m = float(diff.abs().max()) if diff.numel() else 0.0
        if m > worst:
            at = torch.unravel_index(diff.abs().argmax(), diff.shape)
            t, h = int(at[TOKEN_DIM[place.base]]), int(at[HEAD_DIM[place.base]])
            worst, token, head = m, float(tokens[t] if tokens else t), float(heads[h] if heads else h)
    return [sq_diff, sq_ref, worst, token, head, float(len(parts))]


def _gathered(local: list[list[float]], device: str) -> Any:
    """[world, keys, cols] of every rank's statistics."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(local, dtype=torch.float64, device=device).reshape(len(local), _COLS)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out).cpu()


def _rel(sq_diff: float, sq_ref: float) -> float:
    if sq_ref > 0:
        return math.sqrt(sq_diff / sq_ref)
    return 0.0 if sq_diff == 0 else math.inf


def noise(ref: Probe, twin: Probe | None, device: str) -> dict[tuple[int, str], float]:
    """The twin's relative difference from the reference per (layer, tensor), over all ranks."""
    if twin is None:
        return {}
    keys = [(layer, n) for layer in ref.layers for n in "qkvo"]

    def full(p: Probe, layer: int, n: str) -> Any:
        return p.pieces.get((layer, REFERENCE, n), {}).get(0, (None, None))[0]

    local = []
    for layer, n in keys:
        a, b = full(twin, layer, n), full(ref, layer, n)
        if a is None or b is None or a.shape != b.shape:
            local.append([0.0] * _COLS)
            continue
        local.append([float((a - b).double().square().sum()), float(b.double().square().sum()), 0, 0, 0, 1])
    g = _gathered(local, device)
    return {k: _rel(float(g[:, i, 0].sum()), float(g[:, i, 1].sum())) for i, k in enumerate(keys)}


def compare(sp: Probe, ref: Probe, measured: dict[tuple[int, str], float], dtype: str, device: str) -> list[Row]:
    """One row per expected (layer, stage, tensor), judged against its tolerance (collective: every rank calls it)."""
    keys = expected(sp)

    def ref_of(layer: int) -> Any:
        return lambda base: ref.pieces.get((layer, REFERENCE, base), {}).get(0, (None, None))[0]

    local = [_piece_stats(sp.pieces.get(k, {}), ref_of(k[0])) for k in keys]
    g = _gathered(local, device)
    floor = DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["fp32"])
    rows = []
    for i, (layer, stage, name) in enumerate(keys):
        col = g[:, i, :]
        tol = max(NOISE_FACTOR * measured.get((layer, name), 0.0), floor)
        worst_rank = int(col[:, 2].argmax())
        captured = bool((col[:, 5] > 0).all())
        rows.append(Row(layer, stage, name, sp.stages[stage][0], _rel(float(col[:, 0].sum()), float(col[:, 1].sum())),
                        tol, int(col[worst_rank, 3]) if captured else None,
                        int(col[worst_rank, 4]) if captured else None, captured))  # fmt: skip
    return rows


def tolerance_words(dtype: str, measured: dict[tuple[int, str], float]) -> str:
    floor = DTYPE_FLOOR.get(dtype, DTYPE_FLOOR["fp32"])
    if not measured:
        return f"{dtype} floor {floor:.2g} (no noise run)"
    worst = max(measured.values(), default=0.0)
    return f"max({NOISE_FACTOR:g} x measured noise (up to {worst:.2g}), {dtype} floor {floor:.2g})"


def verdict(rows: list[Row]) -> tuple[bool, float, Row | None]:
    """(all within tolerance, smallest margin tol/rel, the first row outside in data-flow order)."""
    bad = next((r for r in rows if not r.ok), None)
    margin = min((r.tol / r.rel if r.rel else math.inf) for r in rows) if rows else math.inf
    return bad is None and bool(rows), margin, bad


def lines(rows: list[Row]) -> list[str]:
    out = []
    for r in rows:
        state = "ok" if r.ok else ("NOT CAPTURED" if not r.captured else "DIFF")
        out.append(f"  layer {r.layer:>2}  {r.name}  {r.label:<34} rel {r.rel:.2e}  tol {r.tol:.2e}  {state}")
    return out
