"""Report sections a reader meets first: title, summary with headline findings, setup, conditions."""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Sequence

from dstui.analysis import identity, speed
from dstui.analysis.comparable import CHANGES_NUMERICS, KEEPS_NUMERICS
from dstui.analysis.parity import NOT_COMPARABLE
from dstui.analysis.rundata import FAILED_STATES, OUTLIER_FACTOR, RunData, distinct_tag
from dstui.core.credential_text import strip_credentials
from dstui.report import charts
from dstui.report.context import ReportContext
from dstui.report.mdformat import IDENTITY_PARAMS, Md, bold, code, codes, esc, escs, fnum, pm, table
from dstui.tracking import tags as tag_keys

_IDENTITY_PARAMS = IDENTITY_PARAMS
MEMORY_SAME = 0.02  # peaks this close (relative) name no condition as using less


def title(ctx: ReportContext) -> str:
    what = f"batch {code(ctx.batch)}" if ctx.batch else (
        f"batch {code(ctx.batches[0])}" if len(ctx.batches) == 1 else f"{len(ctx.batches) or 1} batches"
    )
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    text = (
        f"# dstui report: {esc(ctx.experiment)}\n\n"
        f"Experiment {code(ctx.experiment)} (MLflow id {esc(ctx.exp.experiment_id)}), {what}, "
        f"{_run_count(ctx)}. Generated {now} on {esc(platform.node() or 'unknown host')} "
        f"from {code(strip_credentials(ctx.uri))}.\n"
    )
    if ctx.description.strip():
        paragraphs = [" ".join(p.split()) for p in ctx.description.replace("\r", "").split("\n\n") if p.strip()]
        text += "\n**Description** (from the spec): " + "\n\n".join(esc(p) for p in paragraphs[:10]) + "\n"
    return text


def _run_count(ctx: ReportContext) -> str:
    """'8 runs' or '8 runs (3 never started: not counted)'."""
    text = f"{len(ctx.runs)} runs"
    if ctx.not_started:
        text += f" ({len(ctx.not_started)} never started: listed, not counted)"
    return text


def summary(ctx: ReportContext) -> str:
    lines = ["## Summary", ""]
    _, varying = identity.common_and_varying([r for r in ctx.started if r.kind != "verify"] or ctx.started)
    varying = [v for v in varying if v not in _IDENTITY_PARAMS]
    repeats = max((c.n_runs for c in ctx.conds), default=0)
    revs = sorted({r.revision for r in ctx.started})
    what = f"{len(ctx.conds)} conditions"
    if varying:
        what += " varying " + codes(varying)
    if len(revs) > 1:
        what += f", across DeepSpeed revisions {codes(revs)}"
    what += f"; up to {repeats} repeat(s) each, {_run_count(ctx)} in all."
    lines.append(f"Compared {what}")
    if ctx.baseline:
        lines.append(f"Baseline: {bold(ctx.baseline)}.")
    if ctx.notes:
        lines += ["", "How runs were grouped (a condition's runs ran with the same settings; a value a record lacks "
                  "never splits them):", ""]  # fmt: skip
        lines += [f"- {esc(n, 600)}" for n in ctx.notes[:12]]
        if len(ctx.notes) > 12:
            lines.append(f"- ... and {len(ctx.notes) - 12} more (data.json: notes)")
    lines += ["", "Headline findings:", ""]
    lines += [f"- {h}" for h in headlines(ctx)]
    return "\n".join(lines) + "\n"


def speed_headline(ctx: ReportContext) -> str | None:
    """The fastest condition only where the data bound its ratio over every other; else the figures, unranked."""
    if not any(c.iter_time_mean is not None for c in ctx.train):
        return None
    claim = ctx.fastest
    if claim is None:
        return ("Speed: tokens per step differ between conditions and no tokens/s was recorded, so per-step "
                "times are not compared.")  # fmt: skip
    per = (" (tokens per step differ between conditions, so speed is compared in tokens/s, not per step)"
           if ctx.speed_basis == "tokens" else "")  # fmt: skip
    left_out = [c.label for c in ctx.train if c.iter_time_mean is not None and speed.value(c, ctx.speed_basis) is None]
    per += f" (no tokens/s for {escs(left_out)})" if left_out else ""
    lead = claim.leader
    if not claim.over:
        return f"Speed: {bold(lead.label)} at {ctx.speed(lead)}{per}, the only condition with a speed figure."
    if claim.shown:
        vs = "; ".join(f"{sr.text()} the speed of {esc(c.label)}" for c, sr in claim.over[:4])
        return f"Fastest: {bold(lead.label)} at {ctx.speed(lead)}{per}: {vs}{' ...' if len(claim.over) > 4 else ''}."
    order = [lead, *(c for c, _ in claim.over)]
    figures = ", ".join(f"{esc(c.label)} {ctx.speed(c)}" for c in order[:8]) + (" ..." if len(order) > 8 else "")
    c, sr = claim.unbounded()[0]
    return (f"Speed: no condition is shown to be the fastest; the data do not bound the ratio ({esc(lead.label)} "
            f"over {esc(c.label)}: {sr.text()}). Means, best first: {figures}{per}.")  # fmt: skip


def parity_headline(ctx: ReportContext) -> str:
    npass = sum(p.verdict == "PASS" for p in ctx.parity)
    nfail = sum(p.verdict == "FAIL" for p in ctx.parity)
    other = [p for p in ctx.parity if p.not_comparable and p.compared_with]
    text = f"Loss parity (max |Δloss| ≤ {ctx.tolerance:g}): {npass} PASS, {nfail} FAIL"
    if nfail:
        text += " (" + escs(p.label for p in ctx.parity if p.verdict == "FAIL") + ")"
    nc = [p for p in ctx.parity if p.verdict == NOT_COMPARABLE]
    if nc:
        text += f", {len(nc)} not comparable with the baseline {esc(ctx.baseline)} by design (" + "; ".join(
            f"{esc(p.label)}: {esc(p.not_comparable, 300)}" for p in nc[:4]) + (" ..." if len(nc) > 4 else "") + ")"
    na = [p for p in ctx.parity if p.verdict == "n/a"]
    if na:
        text += f", {len(na)} without a verdict (" + escs(f"{p.label}: {p.note}" for p in na[:4]) + ")"
    if other:
        text += (f"; {len(other)} judged against a condition with the same numerics instead of the baseline "
                 "(see Loss parity)")  # fmt: skip
    return text + "."


def memory_headline(ctx: ReportContext) -> str | None:
    """Least peak memory, with the figures; no winner where the peaks are within 2% of each other."""
    mem = [c for c in ctx.train if c.mem_peak_max is not None]
    if not mem:
        return None
    what = "peak RSS" if ctx.on_cpu else "peak"
    low = min(mem, key=lambda c: c.mem_peak_max)  # type: ignore[arg-type, return-value]
    high = max(mem, key=lambda c: c.mem_peak_max)  # type: ignore[arg-type, return-value]
    if high is low:
        return f"Memory: {bold(low.label)} at {low.mem_peak_gb:.2f} GiB {what}."
    if (high.mem_peak_max - low.mem_peak_max) <= MEMORY_SAME * high.mem_peak_max:  # type: ignore[operator]
        return (f"Memory: all conditions within {MEMORY_SAME:.0%} of each other ({low.mem_peak_gb:.3f} to "
                f"{high.mem_peak_gb:.3f} GiB {what}): none uses noticeably less.")  # fmt: skip
    return f"Least memory: {bold(low.label)} at {low.mem_peak_gb:.2f} GiB {what} ({esc(high.label)}: {high.mem_peak_gb:.2f} GiB)."


def verify_headline(ctx: ReportContext) -> str | None:
    """Verify verdicts counted, each FAIL with its evidence (grad-norm ratio, shape: dstui.core.verdicts)."""
    judged = [c for c in ctx.checks if c.verdict in ("PASS", "FAIL")]
    if not judged:
        return None
    fails = [c for c in judged if c.verdict == "FAIL"]
    text = f"Verification runs: {len(judged) - len(fails)} PASS, {len(fails)} FAIL"
    if fails:
        text += " (" + "; ".join(f"{esc(c.run.run_name)}: {esc(c.evidence or c.reason or 'FAIL', 240)}"
                                 for c in fails[:4]) + (" ..." if len(fails) > 4 else "") + ")"
    return text + "."


def run_headlines(ctx: ReportContext) -> list[str]:
    """Runs that failed, never started, or are still going, by name with their reason."""
    out = []
    # a verify FAIL is a verdict with its numbers (verify_headline), not a run that did not finish
    judged = {c.run.run_id for c in ctx.checks if c.verdict in ("PASS", "FAIL")}
    failed = [r for r in ctx.started if r.status in FAILED_STATES and r.run_id not in judged]
    if failed:
        oom = sum(r.oom for r in failed)
        out.append(
            f"{len(failed)} run(s) did not finish ({oom} out of memory): "
            + ", ".join(f"{esc(r.run_name)} ({'OOM' if r.oom else esc(r.reason, 300)})" for r in failed[:8])
            + (" ..." if len(failed) > 8 else "")
            + "."
        )
    if ctx.not_started:
        where = (lambda r: f" of {code(r.batch or '-')}") if len(ctx.batches) > 1 else (lambda r: "")
        out.append(f"{len(ctx.not_started)} run(s) never launched: "
                   + ", ".join(f"{esc(r.run_name)}{where(r)} ({esc(r.reason or r.status, 300)})"
                               for r in ctx.not_started[:8]) + (" ..." if len(ctx.not_started) > 8 else "")
                   + " — not counted as repeats or conditions.")  # fmt: skip
    other = [r for r in ctx.started if r.status not in (*FAILED_STATES, "done")]
    if other:
        out.append(
            f"{len(other)} run(s) not finished when this report was made: "
            + ", ".join(f"{esc(r.run_name)} ({esc(r.status)})" for r in other[:8])
            + "."
        )
    return out


def headlines(ctx: ReportContext) -> list[str]:
    out = [line for line in (speed_headline(ctx), memory_headline(ctx)) if line is not None]
    for batch, (share, steps, wall) in sorted(ctx.step_shares.items()):
        out.append(f"Step share{f' of {code(batch)}' if len(ctx.step_shares) > 1 else ''}: {share:.0%} of the wall "
                   f"time went to optimizer steps ({steps:.1f} s of {wall:.1f} s) — see Where the time went.")  # fmt: skip
    if ctx.parity:
        out.append(parity_headline(ctx))
    if (line := verify_headline(ctx)) is not None:
        out.append(line)
    out += run_headlines(ctx)
    outl = sum(c.outliers for c in ctx.train)
    if outl:
        out.append(f"{outl} outlier iteration(s) (> {OUTLIER_FACTOR:g}x the run's median) — see Data quality.")
    shared = sum(c.n_overlapped for c in ctx.conds)
    if shared:
        out.append(f"{shared} run(s) timed while other runs shared the machine: their timings are "
                   f"{'kept (--include-overlapped)' if ctx.include_overlapped else 'left out of speed comparisons'}"
                   " — see Data quality.")  # fmt: skip
    return out or ["No timing, memory or loss data was recorded for these runs."]


def hardware(ctx: ReportContext) -> list[str]:
    """Where the started runs ran, as their runners reported it; runs stopped before that are counted apart."""
    hw: dict[tuple[str, ...], int] = {}
    unreported = 0
    for r in ctx.started:
        if not r.tags.get(tag_keys.DEVICE):
            unreported += 1
            continue
        key = tuple(r.tags.get(f"dstui.{k}", "") or "-" for k in ("hostname", "device", "gpu_name", "gpu_count"))
        hw[key] = hw.get(key, 0) + 1
    lines = ["**Hardware**", ""]
    if hw:
        lines += [table(["host", "device", "GPU", "GPUs", "runs"], [[*k, n] for k, n in hw.items()]), ""]
    if unreported or not hw:
        lines += [f"{unreported} started run(s) stopped before their runner reported the hardware"
                  + ("; runs that never started ran nowhere." if ctx.not_started else "."), ""]  # fmt: skip
    return lines


def setup(ctx: ReportContext) -> str:
    lines = ["## Setup", "", *hardware(ctx)]
    runs = ctx.started or ctx.runs
    vrows = []
    for k in ("deepspeed", "torch", "transformers", "python"):
        vals = distinct_tag(runs, f"dstui.version.{k}")
        vrows.append([k, ", ".join(vals) if vals else "not recorded"])
    sha = distinct_tag(runs, tag_keys.DEEPSPEED_GIT_SHA)
    vrows.append(["deepspeed git sha", ", ".join(s[:12] for s in sha) if sha else "not recorded"])
    if len({r.revision for r in runs}) > 1:
        for rev in sorted({r.revision for r in runs}):
            ds = distinct_tag([r for r in runs if r.revision == rev], "dstui.version.deepspeed")
            vrows.append([Md(f"revision {code(rev)}"), ", ".join(ds) or "?"])
    lines += ["**Versions**", "", table(["component", "version"], vrows), ""]
    pool = [r for r in runs if r.kind != "verify"] or runs
    common, varying = identity.common_and_varying(pool)
    shown = {k: v for k, v in common.items() if k not in ("command", "env", "extra_args", "launcher", "ds_overrides")}
    if shown:
        lines += ["**Settings common to all runs** (that record them)", ""]
        lines.append(table(["setting", "value"], [[k, _common_cell(pool, k, v)] for k, v in shown.items()]))
        lines.append("")
    varying = [v for v in varying if v not in _IDENTITY_PARAMS]
    if varying:
        rows = [[c.label, *[_setting_cell(c.settings, c.kind, v) for v in varying]] for c in ctx.conds]
        lines += ["**Settings that differ**", "", table(["condition", *varying], rows), ""]
        lines += [numerics_text(varying), ""]
    lines += ["**What an iteration is**", ""]
    lines.append(iteration_text(ctx, pool))
    return "\n".join(lines) + "\n"


def _common_cell(pool: Sequence[RunData], key: str, v: str) -> Md:
    """The shared value, and how many runs do not record it (a value unknown to them, never assumed)."""
    n = identity.not_recorded(pool, key)
    return Md(code(v) + (f" (not recorded by {n} of {len(pool)} runs)" if n else ""))


def _setting_cell(settings: dict[str, str], kind: str, key: str) -> str:
    """A condition's value of a setting: as its runs record it, '(unset)' when empty, else not recorded."""
    if key in settings:
        return settings[key] if settings[key] != identity.EMPTY else "(unset)"
    return "-" if kind == "command" else "not recorded"


def iteration_text(ctx: ReportContext, pool: Sequence[RunData]) -> str:
    tps = {r.stats.get("tokens_per_step") for r in pool}
    warm = sorted({r.stats.get("warmup_steps", 0) for r in pool})
    r0 = pool[0]
    ga = esc(r0.params.get("grad_accum", "?"))
    mb = esc(r0.params.get("micro_batch", "?"))
    seq = esc(r0.params.get("seq_length", "?"))
    text = (
        "One iteration is one optimizer step: `grad_accum` micro-batches of `micro_batch` sequences "
        "of `seq_length` tokens on every data-parallel rank, timed after a device synchronize. "
    )
    if len(tps) == 1 and None not in tps:
        text += (
            f"Here: {ga} x {mb} x {seq} tokens per rank, **{charts.fmt_num(next(iter(tps)))} tokens per step** "  # type: ignore[arg-type]
            "across all ranks. "
        )
    else:
        text += "Tokens per step differ between conditions; see the conditions table. "
    points = sorted({r.stats["warmup_points"] for r in pool if r.stats.get("warmup_points") is not None})
    if warm == [0]:
        text += "No warm-up is excluded (param `warmup_steps` is 0): every logged step counts. "
    else:
        text += (
            f"Statistics exclude warm-up: optimizer steps up to step {', '.join(str(w) for w in warm)} "
            "of every run (param `warmup_steps`), which include compilation and allocator growth"
        )
        if points:
            text += f"; that is {' or '.join(str(p) for p in points)} logged step(s) per run"
        text += "."
    if any(c.compile_time for c in ctx.train):
        text += (
            " Compile time (DeepCompile / torch.compile, `summary.compile_time`) is reported apart in the "
            "iteration-time section."
        )
    if any(r.stats.get("warmup_used_all") for r in pool):
        text += " Runs shorter than their warm-up use all their steps (flagged under Data quality)."
    return text + "\n"


def conditions(ctx: ReportContext) -> str:
    lines = ["## Conditions", ""]
    lines.append(
        "Status counts every run; figures use the usable runs (finished, or still running) only. "
        "Failed runs stay listed with their reason.\n"
    )
    rows = []
    for c in ctx.conds:
        rows.append([
            c.label,
            c.kind,
            c.n_runs,
            c.statuses,
            fnum(c.runs[0].stats.get("tokens_per_step")),
            pm(ctx.t(c.iter_time_mean), ctx.t(c.iter_time_std) if c.iter_time_std is not None else None),
            fnum(c.tokens_per_s_mean),
            fnum(c.mem_peak_gb, digits=3),
            fnum(c.final_loss, digits=6),
            fnum(c.min_loss, digits=6),
            "; ".join(c.reasons),
        ])
    lines.append(table(
        ["condition", "kind", "runs", "status", "tokens/step", f"iter time ({ctx.unit}) mean ± std", "tokens/s", "peak mem (GiB)", "final loss", "best (min) loss", "failure reason"],
        rows,
    ))
    bad = [r for r in ctx.runs if not r.usable]
    if bad:
        lines += ["", "Runs without usable results:", ""]
        lines.append(table(
            ["run", "condition", "status", "reason", "MLflow run id"],
            [[r.run_name, r.label, "OOM" if r.oom else r.status, r.reason or "-", code(r.run_id)] for r in bad],
        ))
    return "\n".join(lines) + "\n"


def numerics_text(varying: Sequence[str]) -> str:
    """Which of the varying settings change the numerics (so the loss check skips them) and which do not."""
    changes = [v for v in varying if v.split(".", 1)[0] in CHANGES_NUMERICS]
    keeps = [v for v in varying if v.split(".", 1)[0] in KEEPS_NUMERICS]
    parts = []
    if changes:
        parts.append(f"{codes(changes)} {'changes' if len(changes) == 1 else 'change'} the numerics by design: "
                     "conditions that differ in them are not "
                     "judged against each other's loss (see Loss parity)")  # fmt: skip
    if keeps:
        parts.append(f"{codes(keeps)} should not change them: the loss check applies")
    return ("; ".join(parts) + ".") if parts else ""
