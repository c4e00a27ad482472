"""Markdown reports with charts, CSV and JSON, built from MLflow.

:func:`export_report` is the one entry point; the CLI (``dstui report``) and
the TUI's results view both call it. It reads runs from MLflow (so live, old,
imported and team-server runs all work), computes figures with
:mod:`dstui.analysis.runs`, draws PNGs with :mod:`dstui.report.charts` and writes::

    DIR/report.md            the report (charts referenced by relative path)
    DIR/*.png                charts
    DIR/runs.csv             one row per run: identity, status, statistics, settings
    DIR/conditions.csv       one row per condition (what the report's tables show)
    DIR/data.json            everything: params, tags, metrics, statistics, per-step histories
    DIR/grid_iter_time.csv   model x micro_batch grids per ZeRO/offload level (when they apply)
    DIR/grid_mem.csv

(the CSV and JSON files are written by :mod:`dstui.report.files`)
and logs DIR as the ``report`` artifact of the batch's parent run. Failed
runs are never dropped: they appear in every table with their reason.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dstui.analysis import runs as an
from dstui.analysis.runs import ConditionStats, Parity, Progress, RunData
from dstui.report import charts
from dstui.report import files as report_files

DEFAULT_TOLERANCE = 1e-3


def export_report(
    experiment: str,
    out_dir: str | Path,
    *,
    batch: str | None = None,
    runs: Sequence[str] | None = None,
    baseline: str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    tracking_uri: str | None = None,
    progress: Progress | None = None,
    log_artifact: bool = True,
) -> Path:
    """Write a report for an experiment (optionally one batch or given run ids); return report.md.

    ``progress(fraction, message)`` is called between stages so the TUI can
    show where a long export is. ``log_artifact=False`` skips uploading the
    folder to the batch's parent run (for previews).
    """
    from dstui.core import paths
    from dstui.tracking import client as tracking

    def step(frac: float, msg: str) -> None:
        if progress is not None:
            progress(frac, msg)

    uri = tracking_uri or paths.tracking_uri()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    client = tracking.client(uri)

    step(0.0, "searching runs")
    exp, data = an.fetch_runs(client, experiment, batch=batch, run_ids=runs)
    step(0.1, f"reading metric histories of {len(data)} runs")
    method = an.fetch_histories(client, uri, data, progress=progress)
    step(0.6, "computing statistics")
    an.assign_labels(data)
    for r in data:
        r.stats = an.compute_run_stats(r)
    ctx = _Context(experiment, exp, batch, uri, tolerance, method, data)
    ctx.compute(baseline)

    step(0.7, "drawing charts")
    ctx.draw(out)
    step(0.85, "writing report")
    ctx.commands = _commands(data)
    report_files.write_runs_csv(out / "runs.csv", data)
    report_files.write_conditions_csv(out / "conditions.csv", ctx.conds, ctx.parity)
    if ctx.grid:
        report_files.write_grid_csv(out / "grid_iter_time.csv", ctx.grid["iter_time"])
        report_files.write_grid_csv(out / "grid_mem.csv", ctx.grid["mem"])
    parent = None
    parent_batch = batch or (ctx.batches[0] if len(ctx.batches) == 1 else None)
    if log_artifact and parent_batch:
        parent = an.find_batch_parent(client, exp.experiment_id, parent_batch)
        ctx.parent_run_id = parent.info.run_id if parent is not None else None
    report_files.write_json(out / "data.json", ctx)
    report = out / "report.md"
    report.write_text(ctx.markdown(), encoding="utf-8")
    if parent is not None:
        step(0.95, "logging the report to MLflow")
        client.log_artifacts(parent.info.run_id, str(out), artifact_path="report")
    step(1.0, f"report written to {report}")
    return report


# -- computation + rendering context -------------------------------------------


class _Context:
    """Everything one report needs, computed once, rendered to several files."""

    def __init__(
        self,
        experiment: str,
        exp: Any,
        batch: str | None,
        uri: str,
        tolerance: float,
        method: str,
        runs: list[RunData],
    ) -> None:
        self.experiment = experiment
        self.exp = exp
        self.batch = batch
        self.uri = uri
        self.tolerance = tolerance
        self.method = method
        self.runs = runs
        self.batches = an.distinct_tag(runs, "dstui.batch")
        self.conds: list[ConditionStats] = []
        self.train: list[ConditionStats] = []
        self.verify_runs: list[RunData] = []
        self.baseline: str | None = None
        self.parity: list[Parity] = []
        self.grid: dict[str, dict[str, Any]] | None = None
        self.images: dict[str, str] = {}
        self.commands: dict[str, str] = {}
        self.parent_run_id: str | None = None
        self.unit, self.scale = "s", 1.0

    def compute(self, baseline: str | None) -> None:
        self.conds = an.condition_stats(self.runs)
        self.train = [c for c in self.conds if c.kind != "verify"]
        self.verify_runs = [r for r in self.runs if r.kind == "verify"]
        self.baseline = an.choose_baseline(self.train, baseline) if self.train else None
        if self.baseline:
            self.parity = an.loss_parity(self.train, self.baseline, self.tolerance)
        if an.wants_grid(self.runs):
            self.grid = an.grids(self.runs)
        self.unit, self.scale = charts.time_unit([c.iter_time_mean for c in self.train if c.iter_time_mean])

    # -- charts --

    def draw(self, out: Path) -> None:
        labels = [c.label for c in self.train]
        markers = [_marker(c) for c in self.train]
        bands = []
        for c in self.train:
            band = an.loss_band(c)
            if band is not None:
                bands.append((c.label, *band))
        if bands:
            self.images["loss"] = charts.loss_curves(bands, out / "loss.png", baseline=self.baseline).name
        if any(c.iter_time_mean is not None for c in self.train):
            s = self.scale
            self.images["iter_time"] = charts.hbars(
                labels,
                [c.iter_time_mean * s if c.iter_time_mean is not None else None for c in self.train],
                out / "iter_time.png",
                errors=[c.iter_time_std * s if c.iter_time_std is not None else None for c in self.train],
                markers=markers,
                highlight=self.baseline,
                xlabel=f"iteration time per optimizer step ({self.unit}); error bar: ±1 std",
                title="Mean iteration time after warm-up (lower is better; red: baseline)",
            ).name
        if any(c.mem_peak_max is not None for c in self.train):
            self.images["memory"] = charts.hbars(
                labels,
                [c.mem_peak_gb for c in self.train],
                out / "memory.png",
                markers=markers,
                highlight=self.baseline,
                xlabel="peak memory (GB = 2^30 bytes; GPU: CUDA max allocated, CPU: peak RSS)",
                title="Peak memory per rank (lower is better; red: baseline)",
            ).name
        if any(c.tokens_per_s_mean is not None for c in self.train):
            self.images["throughput"] = charts.hbars(
                labels,
                [c.tokens_per_s_mean for c in self.train],
                out / "throughput.png",
                markers=markers,
                highlight=self.baseline,
                xlabel="throughput (tokens/s, all ranks)",
                title="Training throughput after warm-up (higher is better; red: baseline)",
            ).name
        if any(c.mfu_mean is not None for c in self.train):
            self.images["mfu"] = charts.hbars(
                labels,
                [c.mfu_mean * 100 if c.mfu_mean is not None else None for c in self.train],
                out / "mfu.png",
                markers=markers,
                highlight=self.baseline,
                xlabel="model FLOPs utilisation (% of peak)",
                title="MFU after warm-up (higher is better; red: baseline)",
            ).name
        pts = [
            (c.label, c.iter_time_mean * self.scale, c.mem_peak_gb)
            for c in self.train
            if c.iter_time_mean is not None and c.mem_peak_gb is not None
        ]
        if len(pts) >= 2:
            front = [c.label for c in an.pareto(self.train)]
            self.images["tradeoff"] = charts.tradeoff(
                pts, front, out / "tradeoff.png", time_label=f"iteration time ({self.unit})"
            ).name
        series = []
        warm = 0
        for c in self.train:
            repeats, outliers = [], []
            for r in c.runs:
                if r.usable and "iter_time" in r.history and len(r.history["iter_time"][0]):
                    repeats.append(r.history["iter_time"])
                    outliers += list(zip(r.stats.get("outlier_steps", []), r.stats.get("outlier_values", []), strict=False))
                    warm = max(warm, r.stats.get("warmup_steps", 0))
            if repeats:
                series.append((c.label, repeats, outliers))
        if series:
            self.images["iter_series"] = charts.iter_time_series(
                series, out / "iter_time_per_step.png", unit=self.unit, scale=self.scale, warmup=warm
            ).name

    # -- markdown --

    def t(self, seconds: float | None) -> str:
        return "n/a" if seconds is None else charts.fmt_num(seconds * self.scale)

    def markdown(self) -> str:
        parts = [
            self._title(),
            self._summary(),
            self._setup(),
            self._conditions(),
            self._loss(),
            self._iter_time(),
            self._memory(),
            self._throughput(),
            self._parity(),
            self._verify(),
            self._grids(),
            self._quality(),
            self._recommendations(),
            self._appendix(),
        ]
        return "\n".join(p for p in parts if p).rstrip() + "\n"

    def _title(self) -> str:
        what = f"batch `{self.batch}`" if self.batch else (
            f"batch `{self.batches[0]}`" if len(self.batches) == 1 else f"{len(self.batches) or 1} batches"
        )
        now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        return (
            f"# dstui report: {self.experiment}\n\n"
            f"Experiment `{self.experiment}` (MLflow id {self.exp.experiment_id}), {what}, "
            f"{len(self.runs)} runs. Generated {now} on {platform.node() or 'unknown host'} "
            f"from `{report_files.redact(self.uri)}`.\n"
        )

    def _summary(self) -> str:
        lines = ["## Summary", ""]
        _, varying = an.common_and_varying([r for r in self.runs if r.kind != "verify"] or self.runs)
        varying = [v for v in varying if v not in _IDENTITY_PARAMS]
        repeats = max((c.n_runs for c in self.conds), default=0)
        revs = sorted({r.revision for r in self.runs})
        what = f"{len(self.conds)} conditions"
        if varying:
            what += " varying " + ", ".join(f"`{v}`" for v in varying)
        if len(revs) > 1:
            what += f", across DeepSpeed revisions {', '.join(f'`{r}`' for r in revs)}"
        what += f"; up to {repeats} repeat(s) each, {len(self.runs)} runs in all."
        lines.append(f"Compared {what}")
        if self.baseline:
            lines.append(f"Baseline: **{self.baseline}**.")
        lines += ["", "Headline findings:", ""]
        lines += [f"- {h}" for h in self._headlines()]
        return "\n".join(lines) + "\n"

    def _headlines(self) -> list[str]:
        out = []
        timed = [c for c in self.train if c.iter_time_mean is not None]
        base = self._base()
        if timed:
            fast = min(timed, key=lambda c: c.iter_time_mean)  # type: ignore[arg-type, return-value]
            slow = max(timed, key=lambda c: c.iter_time_mean)  # type: ignore[arg-type, return-value]
            text = f"Fastest: **{fast.label}** at {self.t(fast.iter_time_mean)} {self.unit}/step"
            if base and base.iter_time_mean and fast.label != base.label:
                text += f", {base.iter_time_mean / fast.iter_time_mean:.2f}x the speed of the baseline"
            if slow.label != fast.label:
                text += f"; slowest: {slow.label} at {self.t(slow.iter_time_mean)} {self.unit}/step"
            out.append(text + ".")
        mem = [c for c in self.train if c.mem_peak_max is not None]
        if mem:
            low = min(mem, key=lambda c: c.mem_peak_max)  # type: ignore[arg-type, return-value]
            high = max(mem, key=lambda c: c.mem_peak_max)  # type: ignore[arg-type, return-value]
            text = f"Least memory: **{low.label}** at {low.mem_peak_gb:.2f} GB peak"
            if high.label != low.label:
                text += f" ({high.label}: {high.mem_peak_gb:.2f} GB)"
            out.append(text + ".")
        if self.parity:
            npass = sum(p.verdict == "PASS" for p in self.parity)
            nfail = sum(p.verdict == "FAIL" for p in self.parity)
            text = f"Loss parity with {self.baseline} (max |Δloss| ≤ {self.tolerance:g}): {npass} PASS, {nfail} FAIL"
            if nfail:
                text += " (" + ", ".join(p.label for p in self.parity if p.verdict == "FAIL") + ")"
            na = len(self.parity) - npass - nfail
            if na:
                text += f", {na} not comparable (no loss history)"
            out.append(text + ".")
        verdicts = [r.tags.get("dstui.verdict") for r in self.verify_runs if r.tags.get("dstui.verdict")]
        if verdicts:
            out.append(f"Verification runs: {verdicts.count('PASS')} PASS, {verdicts.count('FAIL')} FAIL.")
        failed = [r for r in self.runs if r.status in an.FAILED_STATES]
        if failed:
            oom = sum(r.oom for r in failed)
            out.append(
                f"{len(failed)} run(s) did not finish ({oom} out of memory): "
                + ", ".join(f"{r.run_name} ({'OOM' if r.oom else r.reason})" for r in failed[:8])
                + (" ..." if len(failed) > 8 else "")
                + "."
            )
        other = [r for r in self.runs if r.status not in an.FAILED_STATES and r.status != "done"]
        if other:
            out.append(
                f"{len(other)} run(s) not finished when this report was made: "
                + ", ".join(f"{r.run_name} ({r.status})" for r in other[:8])
                + "."
            )
        outl = sum(c.outliers for c in self.train)
        if outl:
            out.append(f"{outl} outlier iteration(s) (> {an.OUTLIER_FACTOR:g}x the run's median) — see Data quality.")
        return out or ["No timing, memory or loss data was recorded for these runs."]

    def _base(self) -> ConditionStats | None:
        return next((c for c in self.train if c.label == self.baseline), None)

    def _setup(self) -> str:
        lines = ["## Setup", ""]
        hw: dict[tuple[str, ...], int] = {}
        for r in self.runs:
            key = tuple(r.tags.get(f"dstui.{k}", "") or "-" for k in ("hostname", "device", "gpu_name", "gpu_count"))
            hw[key] = hw.get(key, 0) + 1
        lines += ["**Hardware**", "", _table(["host", "device", "GPU", "GPUs", "runs"], [[*k, n] for k, n in hw.items()]), ""]
        vrows = []
        for k in ("deepspeed", "torch", "transformers", "python"):
            vals = an.distinct_tag(self.runs, f"dstui.version.{k}")
            vrows.append([k, ", ".join(vals) if vals else "not recorded"])
        sha = an.distinct_tag(self.runs, "dstui.deepspeed_git_sha")
        vrows.append(["deepspeed git sha", ", ".join(s[:12] for s in sha) if sha else "not recorded"])
        if len({r.revision for r in self.runs}) > 1:
            for rev in sorted({r.revision for r in self.runs}):
                rr = [r for r in self.runs if r.revision == rev]
                ds = an.distinct_tag(rr, "dstui.version.deepspeed")
                vrows.append([f"revision `{rev}`", ", ".join(ds) or "?"])
        lines += ["**Versions**", "", _table(["component", "version"], vrows), ""]
        pool = [r for r in self.runs if r.kind != "verify"] or self.runs
        common, varying = an.common_and_varying(pool)
        shown = {k: v for k, v in common.items() if k not in ("command", "env", "extra_args", "launcher", "ds_overrides")}
        if shown:
            lines += ["**Settings common to all runs**", ""]
            lines.append(_table(["setting", "value"], [[k, f"`{v}`"] for k, v in shown.items()]))
            lines.append("")
        varying = [v for v in varying if v not in _IDENTITY_PARAMS]
        if varying:
            rows = []
            for c in self.conds:
                r0 = c.runs[0]
                rows.append([c.label, *[r0.params.get(v, "") for v in varying]])
            lines += ["**Settings that differ**", "", _table(["condition", *varying], rows), ""]
        lines += ["**What an iteration is**", ""]
        lines.append(self._iteration_text(pool))
        return "\n".join(lines) + "\n"

    def _iteration_text(self, pool: Sequence[RunData]) -> str:
        tps = {r.stats.get("tokens_per_step") for r in pool}
        warm = sorted({r.stats.get("warmup_steps", 0) for r in pool})
        r0 = pool[0]
        ga = r0.params.get("grad_accum", "?")
        mb = r0.params.get("micro_batch", "?")
        seq = r0.params.get("seq_length", "?")
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
        text += (
            f"Statistics exclude warm-up: the first {', '.join(str(w) for w in warm)} optimizer step(s) "
            "of every run (param `warmup_steps`), which include compilation and allocator growth."
        )
        if any(r.stats.get("warmup_used_all") for r in pool):
            text += " Runs shorter than their warm-up use all their steps (flagged under Data quality)."
        return text + "\n"

    def _conditions(self) -> str:
        lines = ["## Conditions", ""]
        lines.append(
            "Status counts every run; figures use the usable runs (finished, or still running) only. "
            "Failed runs stay listed with their reason.\n"
        )
        rows = []
        for c in self.conds:
            rows.append([
                c.label,
                c.kind,
                c.n_runs,
                c.statuses,
                _f(c.runs[0].stats.get("tokens_per_step")),
                _pm(self.t(c.iter_time_mean), self.t(c.iter_time_std) if c.iter_time_std is not None else None),
                _f(c.tokens_per_s_mean),
                _f(c.mem_peak_gb, digits=3),
                _f(c.final_loss, digits=6),
                "; ".join(c.reasons),
            ])
        lines.append(_table(
            ["condition", "kind", "runs", "status", "tokens/step", f"iter time ({self.unit}) mean ± std", "tokens/s", "peak mem (GB)", "final loss", "failure reason"],
            rows,
        ))
        bad = [r for r in self.runs if not r.usable]
        if bad:
            lines += ["", "Runs without usable results:", ""]
            lines.append(_table(
                ["run", "condition", "status", "reason", "MLflow run id"],
                [[r.run_name, r.label, "OOM" if r.oom else r.status, r.reason or "-", f"`{r.run_id}`"] for r in bad],
            ))
        return "\n".join(lines) + "\n"

    def _img(self, key: str, alt: str) -> str:
        return f"![{alt}]({self.images[key]})\n" if key in self.images else ""

    def _loss(self) -> str:
        if "loss" not in self.images:
            return "## Loss\n\nNo loss history was recorded.\n"
        return (
            "## Loss\n\n" + self._img("loss", "loss curves")
            + "\nOne line per condition: the mean over its repeats at each step; the shaded band spans "
            "the lowest and highest repeat. Warm-up steps are included (loss is deterministic from step one).\n"
        )

    def _iter_time(self) -> str:
        if "iter_time" not in self.images:
            return "## Iteration time\n\nNo iteration times were recorded.\n"
        base = self._base()
        rows = []
        for c in self.train:
            speed = ""
            if base and base.iter_time_mean and c.iter_time_mean:
                speed = f"{base.iter_time_mean / c.iter_time_mean:.3f}x"
            rows.append([
                c.label,
                self.t(c.iter_time_mean),
                self.t(c.iter_time_std),
                self.t(c.iter_time_repeat_std) if c.iter_time_repeat_std is not None else "-",
                c.iter_points,
                c.n_usable,
                speed,
            ])
        table = _table(
            ["condition", f"mean ({self.unit})", f"std ({self.unit})", f"std of repeat means ({self.unit})", "iterations", "usable runs", "speed vs baseline"],
            rows,
        )
        return (
            "## Iteration time\n\n" + self._img("iter_time", "iteration time")
            + "\nMean and sample standard deviation (n-1) over all post-warm-up iterations of a condition's usable "
            "repeats; 'std of repeat means' shows run-to-run spread. Speed vs baseline = baseline time / condition time "
            "(> 1 is faster).\n\n" + table + "\n"
        )

    def _memory(self) -> str:
        if "memory" not in self.images:
            return "## Memory\n\nNo memory readings were recorded.\n"
        base = self._base()
        rows = []
        for c in self.train:
            ratio = ""
            if base and base.mem_peak_max and c.mem_peak_max:
                ratio = f"{c.mem_peak_max / base.mem_peak_max:.3f}x"
            rows.append([c.label, _f(c.mem_peak_gb, digits=3), ratio])
        return (
            "## Memory\n\n" + self._img("memory", "peak memory")
            + "\nPeak memory of rank 0 over the whole run (warm-up included: a peak is a peak), mean over repeats. "
            "On GPU this is `torch.cuda.max_memory_allocated`, on CPU the process's peak RSS.\n\n"
            + _table(["condition", "peak (GB)", "vs baseline"], rows) + "\n"
        )

    def _throughput(self) -> str:
        if "throughput" not in self.images and "mfu" not in self.images:
            return ""
        lines = ["## Throughput and MFU", ""]
        if "throughput" in self.images:
            lines.append(self._img("throughput", "throughput"))
            if any(c.tokens_per_s_derived for c in self.train):
                lines.append(
                    "Where a run did not log `tokens_per_s`, throughput is tokens per step / mean iteration time.\n"
                )
        if "mfu" in self.images:
            lines.append(self._img("mfu", "MFU"))
        rows = [
            [c.label, _f(c.tokens_per_s_mean), _f(c.tflops_per_gpu_mean), _f(c.mfu_mean * 100 if c.mfu_mean is not None else None, digits=2)]
            for c in self.train
        ]
        lines.append(_table(["condition", "tokens/s", "TFLOP/s per GPU", "MFU (%)"], rows))
        return "\n".join(lines) + "\n"

    def _parity(self) -> str:
        if not self.baseline:
            return ""
        lines = ["## Loss parity against the baseline", ""]
        lines.append(
            f"Baseline **{self.baseline}**; tolerance {self.tolerance:g} on the absolute loss difference. "
            "For each condition the per-step mean loss (over repeats) is compared with the baseline's on the steps "
            "both logged; PASS when the largest difference is within the tolerance.\n"
        )
        if not self.parity:
            lines.append("Only one condition: nothing to compare.")
            return "\n".join(lines) + "\n"
        rows = [
            [p.label, p.common_steps, _e(p.max_abs_diff), _e(p.mean_abs_diff), _e(p.final_diff), f"**{p.verdict}**", p.note]
            for p in self.parity
        ]
        lines.append(_table(["condition", "common steps", "max abs diff", "mean abs diff", "final diff", "verdict", "note"], rows))
        return "\n".join(lines) + "\n"

    def _verify(self) -> str:
        if not self.verify_runs:
            return ""
        keys: list[str] = []
        for r in self.verify_runs:
            for k in r.metrics:
                if ("diff" in k or k.startswith("verify")) and k not in keys:
                    keys.append(k)
        rows = []
        for r in self.verify_runs:
            rows.append([
                r.run_name,
                r.label,
                "OOM" if r.oom else r.status,
                f"**{r.tags.get('dstui.verdict', 'n/a')}**",
                *[_e(r.metrics.get(k)) for k in keys],
            ])
        head = ["run", "condition", "status", "verdict", *keys]
        tol = {(r.params.get("rtol", "?"), r.params.get("atol", "?")) for r in self.verify_runs}
        tol_text = "; ".join(f"rtol {a}, atol {b}" for a, b in sorted(tol))
        return (
            "## Verification runs (`kind: verify`)\n\n"
            "ZeRO against plain PyTorch: loss, gradients and parameters compared element-wise "
            f"({tol_text}); the verdict is the runner's own.\n\n" + _table(head, rows) + "\n"
        )

    def _grids(self) -> str:
        if not self.grid:
            return ""
        lines = ["## Grids by model and micro batch", ""]
        lines.append(
            "Rows: model; columns: micro batch per GPU; one table per ZeRO stage / offload level. "
            "Cells are means over usable repeats; **OOM** = every run of the cell ran out of memory, "
            "**FAIL** = failed for another reason, empty = not run. Also in `grid_iter_time.csv` and `grid_mem.csv`.\n"
        )
        for name, title in (("iter_time", "Iteration time (s)"), ("mem", "Peak memory (GB)")):
            lines += [f"### {title}", ""]
            for level, frame in self.grid[name].items():
                rows = [[model, *[report_files.cell(v) for v in frame.loc[model].tolist()]] for model in frame.index]
                lines += [f"**{level}**", "", _table(["model \\ micro batch", *frame.columns.tolist()], rows), ""]
        return "\n".join(lines) + "\n"

    def _quality(self) -> str:
        lines = ["## Data quality", ""]
        rows = []
        for c in self.conds:
            usable = [r for r in c.runs if r.usable]
            pts = [r.stats.get("points", 0) for r in c.runs]
            warm = sorted({r.stats.get("warmup_steps", 0) for r in usable}) or [0]
            flags = []
            if any(r.stats.get("warmup_used_all") for r in usable):
                flags.append("shorter than warm-up")
            if any(r.stats.get("loss_nan") for r in usable):
                flags.append("NaN loss")
            if usable and not any("iter_time" in r.history for r in usable):
                flags.append("no iteration times")
            rows.append([
                c.label,
                f"{c.n_usable}/{c.n_runs}",
                ", ".join(str(p) for p in pts),
                ", ".join(str(w) for w in warm),
                c.iter_points,
                c.outliers,
                "; ".join(flags) or "-",
            ])
        lines.append(
            f"Outlier rule: a post-warm-up iteration slower than {an.OUTLIER_FACTOR:g}x the median iteration of "
            "its run (e.g. a checkpoint, a GC pause or a noisy neighbour). Outliers stay in the statistics; "
            "they are listed so that you can judge them.\n"
        )
        lines.append(_table(
            ["condition", "usable runs", "points per run", "warm-up steps", "iterations in stats", "outliers", "flags"], rows
        ))
        out_rows = []
        for r in self.runs:
            for s, v in zip(r.stats.get("outlier_steps", []), r.stats.get("outlier_values", []), strict=False):
                out_rows.append([r.run_name, s, self.t(v), f"{v / r.stats['iter_time_median']:.1f}x"])
        if out_rows:
            lines += ["", f"Outlier iterations ({len(out_rows)}{', first 30' if len(out_rows) > 30 else ''}):", ""]
            lines.append(_table(["run", "step", f"time ({self.unit})", "x median"], out_rows[:30]))
        if "iter_series" in self.images:
            lines += ["", self._img("iter_series", "iteration time per step")]
        lines.append(
            f"\nMetric histories read {_METHODS.get(self.method, self.method)}; "
            "system metrics (`system/...`) stay in MLflow and are not part of this report."
        )
        return "\n".join(lines) + "\n"

    def _recommendations(self) -> str:
        lines = ["## Recommendations", ""]
        timed = [c for c in self.train if c.iter_time_mean is not None]
        if not timed:
            lines.append("No usable timings: nothing to recommend yet.")
            return "\n".join(lines) + "\n"
        fast = min(timed, key=lambda c: c.iter_time_mean)  # type: ignore[arg-type, return-value]
        lines.append(f"- **Fastest**: {fast.label} ({self.t(fast.iter_time_mean)} {self.unit}/step).")
        mem = [c for c in self.train if c.mem_peak_max is not None]
        if mem:
            low = min(mem, key=lambda c: c.mem_peak_max)  # type: ignore[arg-type, return-value]
            lines.append(f"- **Least memory**: {low.label} ({low.mem_peak_gb:.3f} GB peak).")
        lossy = [c for c in self.train if c.final_loss is not None and math.isfinite(c.final_loss)]
        if lossy:
            best = min(lossy, key=lambda c: c.final_loss)  # type: ignore[arg-type, return-value]
            spread = max(c.final_loss for c in lossy) - best.final_loss  # type: ignore[operator]
            text = f"- **Best final loss**: {best.label} ({best.final_loss:.6f})"
            if spread <= self.tolerance:
                text += f" — but all conditions end within {self.tolerance:g} of each other, so loss does not separate them"
            lines.append(text + ".")
        front = an.pareto(self.train)
        if len(front) > 1:
            lines.append(
                "- **Speed / memory trade-off**: no condition is both faster and smaller than these: "
                + "; ".join(f"{c.label} ({self.t(c.iter_time_mean)} {self.unit}, {c.mem_peak_gb:.2f} GB)" for c in front)
                + ". Pick the fastest that fits your memory budget."
            )
        elif len(front) == 1:
            lines.append(f"- **Speed / memory trade-off**: {front[0].label} is both the fastest and the smallest of the timed conditions.")
        fails = [p.label for p in self.parity if p.verdict == "FAIL"]
        if fails:
            lines.append(f"- Before adopting {', '.join(fails)}: their loss differs from the baseline beyond {self.tolerance:g}.")
        oom = [c.label for c in self.train if c.n_oom]
        if oom:
            lines.append(f"- Out of memory: {', '.join(oom)} — try a higher ZeRO stage, offload or a smaller micro batch.")
        lines.append("")
        lines.append(self._img("tradeoff", "speed/memory trade-off"))
        return "\n".join(lines) + "\n"

    def _appendix(self) -> str:
        lines = ["## Appendix", "", "### MLflow runs", ""]
        if self.parent_run_id:
            lines.append(f"Parent (batch) run: `{self.parent_run_id}`.\n")
        lines.append(_table(
            ["run", "condition", "revision", "repeat", "status", "batch", "MLflow run id"],
            [[r.run_name, r.condition, r.revision, r.repeat, "OOM" if r.oom else r.status, r.batch, f"`{r.run_id}`"] for r in self.runs],
        ))
        lines += ["", "### Commands", ""]
        for r in self.runs:
            cmd = self.commands.get(r.run_id) or "(not recorded)"
            lines += [f"`{r.run_name}`:", "", "```", cmd.strip(), "```", ""]
        lines += ["### DeepSpeed configs", ""]
        groups: dict[str, list[str]] = {}
        for r in self.runs:
            cfg = ds_config_of(r)
            if not cfg:
                continue
            text = json.dumps(cfg, indent=2, sort_keys=True)
            labels = groups.setdefault(text, [])
            if r.label not in labels:
                labels.append(r.label)
        if not groups:
            lines.append("No `ds.*` params were recorded.")
        for text, labels in groups.items():
            lines += [f"Used by: {', '.join(labels)}", "", "```json", text, "```", ""]
        return "\n".join(lines) + "\n"


_METHODS = {
    "sqlite": "directly from the SQLite store (fast path)",
    "sql": "from the SQL store with one query per run",
    "api": "through MLflow's get_metric_history",
}
_IDENTITY_PARAMS = frozenset({"seed", "nvme_path", "hung_after_s", "run_key", "revision", "repeat"})


def ds_config_of(run: RunData) -> dict[str, Any]:
    """The ds_config rebuilt from the flattened ``ds.*`` params."""
    cfg: dict[str, Any] = {}
    for k, v in sorted(run.params.items()):
        if not k.startswith("ds."):
            continue
        node = cfg
        parts = k[3:].split(".")
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                break
            node = nxt
        else:
            node[parts[-1]] = an.parse_value(v)
    return cfg


def _commands(runs: Sequence[RunData]) -> dict[str, str]:
    """Exact argv of each run: tag dstui.cmd, else the artifact run/cmd.txt."""
    out = {}
    for r in runs:
        cmd = r.tags.get("dstui.cmd", "")
        if not cmd and r.artifact_uri:
            cmd = _read_artifact(r, "run/cmd.txt")
        out[r.run_id] = cmd
    return out


def _read_artifact(run: RunData, rel: str) -> str:
    from urllib.parse import unquote, urlparse

    try:
        parsed = urlparse(run.artifact_uri)
        if parsed.scheme in ("", "file"):
            p = Path(unquote(parsed.path)) / rel
            return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else ""
        import mlflow.artifacts

        local = mlflow.artifacts.download_artifacts(run_id=run.run_id, artifact_path=rel)
        return Path(local).read_text(encoding="utf-8", errors="replace")
    except Exception:  # noqa: BLE001 - a missing command is reported as such, not fatal
        return ""


# -- formatting helpers ----------------------------------------------------------


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def _f(v: float | None, digits: int | None = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:.{digits}f}" if digits is not None else charts.fmt_num(v)


def _e(v: float | None) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return f"{v:.3e}"


def _pm(mean: str, std: str | None) -> str:
    return mean if std is None or mean == "n/a" else f"{mean} ± {std}"


def _marker(c: ConditionStats) -> str:
    if c.n_usable:
        return "no data"
    if c.n_oom:
        return "OOM"
    if c.n_failed:
        return "failed"
    return c.statuses or "no data"
