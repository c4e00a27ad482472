"""Pure helpers of the ZeRO-vs-PyTorch parity runner (``runners/compare_loss.py``).

They live apart from the runner so that unit tests can check the comparison
semantics and the option aliases without starting a process group or
importing DeepSpeed. Only torch is needed here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

# The seed (DeepSpeedExamples' compare_loss.py) spells dtypes as torch names;
# dstui Settings use short names. Both are accepted, the short one is canonical.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "torch.float": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "torch.half": "fp16",
}

def canonical_dtype(text: str) -> str:
    """``torch.bfloat16`` / ``bfloat16`` / ``bf16`` -> ``bf16`` (argparse ``type=``)."""
    key = text.strip().lower()
    if key not in DTYPE_ALIASES:
        known = ", ".join(sorted(set(DTYPE_ALIASES.values())))
        raise ValueError(f"unknown dtype '{text}' (use {known} or torch.<name>)")
    return DTYPE_ALIASES[key]


def option_names(setting: str, *extra: str) -> list[str]:
    """Dash form of a dstui setting name first, then its underscore form and extras.

    ``--zero-stage`` is what dstui's launcher writes; ``--zero_stage`` is what
    people who used the seed script type. Both must keep working.
    """
    dash = "--" + setting.replace("_", "-")
    names = [dash]
    under = "--" + setting
    if under != dash:
        names.append(under)
    names.extend(e for e in extra if e not in names)
    return names


def synthetic_batch(
    seed: int, step: int, *, global_batch: int, seq_length: int, vocab_size: int
) -> torch.Tensor:
    """Token ids of one optimizer step's global batch, identical on every rank.

    Drawn from a private generator keyed by (seed, step) so that the data do not
    depend on how much of the global RNG the model init or DeepSpeed consumed.
    Each rank slices its own micro-batch out of it (see :func:`rank_slice`).
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab_size, (global_batch, seq_length), generator=gen)


def rank_slice(batch: torch.Tensor, rank: int, micro_batch: int) -> torch.Tensor:
    return batch[rank * micro_batch : (rank + 1) * micro_batch]


@dataclass
class Diff:
    """How far a DeepSpeed tensor set is from the baseline's.

    ``ok`` uses :func:`torch.allclose` semantics element-wise,
    ``|ds - base| <= atol + rtol * |base|``, with NaN never close; so
    ``rtol = atol = 0`` means bit-for-bit equality (up to -0.0 == 0.0).
    ``max_rel`` divides by ``|base|`` clamped to the smallest normal float so
    that it stays finite (a difference where the baseline is exactly zero shows
    as a huge number instead of ``inf``, which JSON and MLflow handle badly).
    """

    max_abs: float = 0.0
    max_rel: float = 0.0
    #: largest |d| / (atol + rtol |base|): the margin (below 1 within tolerance; inf for any |d| > 0 when exact)
    max_ratio: float = 0.0
    #: the tensor of ``max_ratio``, with its |d| and the tolerance it had at that element
    ratio_name: str = ""
    ratio_abs: float = 0.0
    ratio_tol: float = 0.0
    ok: bool = True
    worst: str = ""
    count: int = 0
    #: (name, max |d|, elements out of tolerance, elements) of every tensor that is not close
    offenders: list[tuple[str, float, int, int]] = field(default_factory=list)
    #: (name, max |d|) of every tensor, close or not
    per_tensor: list[tuple[str, float]] = field(default_factory=list)
    _worst_abs: float = field(default=-1.0, repr=False)

    def add(self, name: str, ds: torch.Tensor, base: torch.Tensor, rtol: float, atol: float) -> None:
        """Fold one tensor pair in (both are compared in float64 on the CPU)."""
        if ds.shape != base.shape:
            raise ValueError(f"{name}: shape {tuple(ds.shape)} != baseline {tuple(base.shape)}")
        a = ds.detach().to("cpu", torch.float64)
        b = base.detach().to("cpu", torch.float64)
        self.count += 1
        if a.numel() == 0:
            return
        close = torch.isclose(a, b, rtol=rtol, atol=atol)
        absdiff = (a - b).abs()
        if not bool(close.all()):
            self.ok = False
            bad = int((~close).sum())
            self.offenders.append((name, float(absdiff.nan_to_num(math.inf).max()), bad, a.numel()))
        # NaN in either side: count it as an infinite difference, not a silent 0.
        absdiff = torch.where(torch.isnan(absdiff), torch.full_like(absdiff, math.inf), absdiff)
        tiny = torch.finfo(torch.float32).tiny
        rel = absdiff / b.abs().clamp_min(tiny)
        m_abs = float(absdiff.max())
        m_rel = float(rel.max())
        allowed = atol + rtol * b.abs()
        ratio = torch.where(absdiff == 0, torch.zeros_like(absdiff), absdiff / allowed).nan_to_num(math.inf)
        at = int(ratio.reshape(-1).argmax())
        if float(ratio.reshape(-1)[at]) > self.max_ratio or not self.ratio_name:
            self.max_ratio = max(self.max_ratio, float(ratio.reshape(-1)[at]))
            self.ratio_name = name
            self.ratio_abs = float(absdiff.reshape(-1)[at])
            self.ratio_tol = float(allowed.reshape(-1)[at])
        self.per_tensor.append((name, m_abs))
        if m_abs > self._worst_abs:
            self._worst_abs = m_abs
            self.worst = name
        self.max_abs = max(self.max_abs, m_abs)
        self.max_rel = max(self.max_rel, m_rel)


def compare_named(
    pairs: Iterable[tuple[str, torch.Tensor, torch.Tensor]], rtol: float, atol: float
) -> Diff:
    """A :class:`Diff` over (name, deepspeed, baseline) triples."""
    diff = Diff()
    for name, ds, base in pairs:
        diff.add(name, ds, base, rtol, atol)
    return diff


def worst_tensors(diffs: dict[str, Diff], top: int = 5, *, offenders_only: bool = False) -> list[dict]:
    """The ``top`` largest differences as ``{"name", "kind", "max_abs_diff"}`` (the summary's ``worst``).

    ``offenders_only``: only tensors outside their tolerance (what a FAIL names).
    """
    rows = []
    for kind, d in diffs.items():
        pairs = [(o[0], o[1]) for o in d.offenders] if offenders_only else d.per_tensor
        rows += [{"name": n, "kind": kind, "max_abs_diff": m} for n, m in pairs if m > 0 or offenders_only]
    rows.sort(key=lambda r: -r["max_abs_diff"])
    return rows[:top]


def scalar_diff(ds: float, base: float, rtol: float, atol: float) -> tuple[float, bool]:
    """Absolute difference of two losses and whether they are close (allclose rules)."""
    if math.isnan(ds) or math.isnan(base):
        return math.inf, False
    d = abs(ds - base)
    return d, d <= atol + rtol * abs(base)


def verdict_line(first_step: int | None, reason: str) -> str:
    """The final human line rank 0 prints; scripts grep for ``PASS`` / ``FAIL``."""
    if first_step is None:
        return "PASS"
    return f"FAIL (first diverging step {first_step}: {reason})"


@dataclass(frozen=True)
class StepEvidence:
    """What one step's comparison found, everything a FAIL reason states (one rank's view, combined)."""

    shape: str = ""  # the gradient's shape (parity_shape.Shape.text)
    rank_spread: float = 0.0
    loss: tuple[float, float] | None = None  # (|d|, tolerance) when out of tolerance
    l2: tuple[float, float] | None = None  # (|d-g|/|g|, tolerance) when out
    #: (DeepSpeed's pre-clip gradient norm, the baseline's, their |d|/|g|, tolerance) when out
    norm: tuple[float, float, float, float] | None = None
    tensors: tuple[tuple[str, str, float, float], ...] = ()  # (kind, name, |d|, tolerance) out of tolerance


def divergence_reason(ev: StepEvidence) -> str:
    """One line: the gradient's shape first, then each check that failed with its number and tolerance."""
    parts = [ev.shape] if ev.shape else []
    if ev.rank_spread > 0:
        parts.append(f"ranks disagree by up to {ev.rank_spread:.3e}")
    if ev.loss:
        parts.append(f"loss |d| {ev.loss[0]:.3e} > {ev.loss[1]:.3e}")
    if ev.l2:
        parts.append(f"whole gradient |d-g|/|g| {ev.l2[0]:.3e} > {ev.l2[1]:.3e}")
    if ev.norm:
        # with the gradient itself wrong, the norm only follows it; alone, clipping used a wrong one
        why = "" if ev.l2 else ": the gradients agree, the norm DeepSpeed clipped by does not"
        parts.append(f"pre-clip gradient norm {ev.norm[0]:.4g} vs baseline {ev.norm[1]:.4g} "
                     f"(|d|/|g| {ev.norm[2]:.3e} > {ev.norm[3]:.3e}){why}")
    for kind, name, d, tol in ev.tensors:
        parts.append(f"{kind} |d| {d:.3e} > {tol:.3e} in {name}")
    return "; ".join(parts) or "no difference recorded"
