"""Report sections on correctness and revisions: loss parity, revision comparison, verify runs.

The sequence-parallel check has its own section (:mod:`dstui.report.sections.sequence_parallel`).
"""

from __future__ import annotations

from dstui.analysis.checks import CheckResult
from dstui.analysis.intervals import METHOD as INTERVAL_METHOD
from dstui.analysis.intervals import RECOMMENDED_REPEATS
from dstui.analysis.revision_compare import ALPHA
from dstui.core.formatting import fmt_bytes, fmt_interval
from dstui.report.context import ReportContext
from dstui.report.mdformat import Md, bold, code, esc, escs, fexp, img, table


def parity(ctx: ReportContext) -> str:
    if not ctx.baseline:
        return ""
    lines = ["## Loss parity against the baseline", ""]
    lines.append(
        f"Baseline {bold(ctx.baseline)}; tolerance {ctx.tolerance:g} on the absolute loss difference "
        f"(tolerance: {esc(ctx.tolerance_basis or 'given')}). "
        "For each condition the per-step mean loss (over repeats) is compared with the baseline's on the steps "
        "both logged; PASS when the largest difference is within the tolerance. "
        "The check applies only where both should compute the same numbers: settings such as the ZeRO stage, "
        "offload, torch.compile, DeepCompile or the DeepSpeed revision should not change the loss beyond the "
        "tolerance, while micro batch, gradient accumulation, sequence length, dtype, model, learning rate or seed "
        "change it by design. A condition that differs from the baseline in such a setting is compared with the "
        "first condition that shares its numerics (column 'compared with'), or marked **not comparable** with "
        "the reason when there is none.\n"
    )
    if not ctx.parity:
        lines.append("Only one condition: nothing to compare.")
        return "\n".join(lines) + "\n"
    rows = [
        [p.label, p.compared_with or "-", p.common_steps, fexp(p.max_abs_diff), fexp(p.mean_abs_diff),
         fexp(p.final_diff), bold(p.verdict), p.note]
        for p in ctx.parity
    ]  # fmt: skip
    lines.append(table(["condition", "compared with", "common steps", "max abs diff", "mean abs diff", "final diff",
                        "verdict", "note"], rows))  # fmt: skip
    return "\n".join(lines) + "\n"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 1000:.2f}"


def revisions(ctx: ReportContext) -> str:
    """Each revision against the baseline revision: what ``dstui compare`` prints, with a chart."""
    if not ctx.revisions:
        return ""
    lines = ["## Revisions against the baseline revision", ""]
    lines.append(
        f"Baseline revision {bold(ctx.base_revision)}. Per condition, each run's mean iteration time after warm-up is "
        "one sample (repeats are the independent samples). Ratio = revision mean / baseline mean (< 1 is faster); "
        f"interval: {INTERVAL_METHOD}; p: Welch's two-sided t-test, alpha {ALPHA:g}. "
        "The same computation as `dstui compare`.\n"
    )
    lines.append(img(ctx, "revisions", "revision ratios with 95% intervals"))
    rows = []
    for c in ctx.revisions:
        rows.append([
            c.condition, c.revision, f"{c.n}/{c.n_base}",
            f"{_ms(c.mean)} ± {_ms(c.std)}" if c.std is not None else _ms(c.mean),
            f"{_ms(c.base_mean)} ± {_ms(c.base_std)}" if c.base_std is not None else _ms(c.base_mean),
            "n/a" if c.ratio is None else f"{c.ratio:.3f}",
            Md(fmt_interval(*c.ratio_ci)) if c.ratio_ci else "none: too few repeats" if min(c.n, c.n_base) < 2 else "none",
            "n/a" if c.p_value is None else f"{c.p_value:.3g}",
            fmt_bytes(c.mem_diff, signed=True),
            Md(c.verdict),  # dstui's own words around numbers (revision_compare)
        ])  # fmt: skip
    lines.append(table(
        ["condition", "revision", "n / n baseline", "iter ms (mean ± std)", "baseline ms", "ratio", "95% CI of ratio",
         "p (Welch)", "peak mem diff", "verdict"], rows,
    ))
    few = [c for c in ctx.revisions if min(c.n, c.n_base) < RECOMMENDED_REPEATS]
    if few:
        lines += ["", (
            f"**Warning: too few repeats** for {escs(f'{c.condition} / {c.revision}' for c in few)} "
            f"(fewer than {RECOMMENDED_REPEATS} usable runs on a side): intervals are wide or absent and a "
            "p-value from 2 runs says little. Run more repeats before concluding."
        )]
    return "\n".join(lines) + "\n"


#: differences the verify table shows: absolute ones, and the whole gradient's relative L2 distance. The
#: per-element relative maxima are left out: an element whose baseline is ~0 makes them 1e+41 and mean nothing.
VERIFY_COLUMNS = {"loss_abs_diff": "max loss |d|", "grad_max_abs_diff": "max grad |d|",
                  "param_max_abs_diff": "max param |d|", "grad_l2_rel_diff": "max grad |d-g|/|g|"}


def _ratios(ch: CheckResult) -> str:
    if ch.ratio_range is None:
        return "-"
    lo, hi, _ = ch.ratio_range
    return f"{lo:.4f}" if hi == lo else f"{lo:.4f} to {hi:.4f}"


def _margin(ch: CheckResult) -> str:
    if ch.margin is None:
        return "-"
    return "0 (bit-exact)" if ch.margin == 0 else f"{ch.margin:.2f}"


def verify(ctx: ReportContext) -> str:
    if not ctx.checks:
        return ""
    rows = []
    for ch in ctx.checks:
        r = ch.run
        worst = Md(", ".join(f"{esc(w.get('kind', '?'))} {code(w['name'])} ({fexp(_float(w.get('max_abs_diff')))})"
                             for w in ch.worst[:3]))  # fmt: skip
        rows.append([
            r.run_name, r.label, "OOM" if r.oom else r.status, bold(ch.verdict),
            "-" if ch.first_diverging_step is None else ch.first_diverging_step,
            _ratios(ch), _margin(ch), worst or "-",
            *[fexp(ch.maxima.get(k)) for k in VERIFY_COLUMNS],
        ])
    head = ["run", "condition", "status", "verdict", "first diverging step", "grad-norm ratio (DS / baseline)",
            "margin (diff / tol)", "worst tensors", *VERIFY_COLUMNS.values()]
    tol = {(fexp(c.rtol) if c.rtol is not None else "?", fexp(c.atol) if c.atol is not None else "?") for c in ctx.checks}
    tol_text = "; ".join(f"rtol {a}, atol {b}" for a, b in sorted(tol))
    bases = [esc(b, 300) for b in sorted({c.tolerance_basis for c in ctx.checks if c.tolerance_basis})]
    lines = [
        "## Verification runs (`kind: verify`)", "",
        "DeepSpeed against plain PyTorch: the loss, the gradient the optimizer applies and the fp32 master weights "
        f"compared element-wise ({tol_text}{'; ' + '; '.join(bases) if bases else ''}), and the whole gradient's "
        "relative L2 distance; the verdict is the runner's own. The first diverging step is the first step at which "
        "any of them left the tolerance. The grad-norm ratio is |DeepSpeed's applied gradient| / |the baseline's| per "
        "step (1 up to rounding when they agree; exactly 1/GAS, (W-1)/W, ... for a reduction bug); the margin is the "
        "largest difference divided by its tolerance (a PASS stays at or below 1).\n",
        table(head, rows), "",
    ]
    for ch in ctx.checks:
        if ch.evidence:
            lines += [f"{code(ch.run.run_name)}: {esc(ch.evidence, 400)}", ""]
        if ch.worst:
            lines += [f"Worst tensors of {code(ch.run.run_name)} (largest |difference| first):", ""]
            lines.append(table(["tensor", "kind", "max abs diff"],
                               [[code(w["name"]), w.get("kind", "?"), fexp(_float(w.get("max_abs_diff")))]
                                for w in ch.worst[:10]]))  # fmt: skip
            lines.append("")
        if ch.reason:
            lines += [f"{code(ch.run.run_name)} (first diverging step): {esc(ch.reason, 600)}", ""]
    lines.append(img(ctx, "verify_steps", "per-step differences of verify runs"))
    return "\n".join(lines) + "\n"


def _float(v: object) -> float | None:
    """A number from a run's JSON (worst tensors): anything else is no number."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    return None
