"""The results screen's table, as data: which rows, in which order, with which cells (no textual here).

Rows are the conditions (or runs) loaded by dstui/tui/results_data.py. The
baseline comparison is the reports' and `dstui compare`'s: Δ final loss, and
iteration time over the baseline's with a Fieller interval over repeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text

from dstui.analysis.intervals import RatioInterval, fieller_ratio
from dstui.core.formatting import fmt_bytes, fmt_interval, fmt_num

COLUMNS = (
    ("condition", "label"),
    ("runs", "runs"),
    ("iter time (s) mean ± std", "iter_mean"),
    ("tok/s", "tokens_per_s"),
    ("peak mem", "mem_peak"),
    ("final loss", "final_loss"),
    ("Δ loss vs base", "delta"),
    ("status / reason", "status"),
    ("time / base [95% CI]", "ratio"),
)


@dataclass
class View:
    """What the screen shows of loaded results: baseline, grouping, sort and filter."""

    results: Any
    baseline: str | None
    per_run: bool = False
    sort_col: int = 0
    sort_reverse: bool = False
    filter_text: str = ""

    def base_condition(self) -> Any:
        if self.results is None or not self.baseline:
            return None
        return next((c for c in self.results.conditions if c.label == self.baseline), None)

    def delta(self, r: Any) -> float | None:
        """Final loss minus the baseline condition's."""
        base = self.base_condition()
        if base is None or base.final_loss is None or r.final_loss is None:
            return None
        return r.final_loss - base.final_loss

    def ratio(self, r: Any) -> RatioInterval | None:
        """Iteration time against the baseline condition: the report's and compare's interval (Fieller)."""
        if self.per_run or r.label == self.baseline:
            return None
        base = self.base_condition()
        if base is None or not r.run_means or not base.run_means:
            return None
        return fieller_ratio(r.run_means, base.run_means)

    def rows(self) -> list[Any]:
        """Conditions (or runs) that pass the filter, in the chosen order (spec order by default)."""
        if self.results is None:
            return []
        rows = list(self.results.runs if self.per_run else self.results.conditions)
        if self.filter_text:
            f = self.filter_text.lower()
            rows = [r for r in rows if f in f"{r.label} {r.run_name} {r.batch} {r.status}".lower()]
        key = COLUMNS[self.sort_col][1]
        if self.sort_col == 0 and not self.sort_reverse:
            return rows  # spec order
        if key in ("label", "runs", "status"):
            rows.sort(key=lambda r: str(r.run_name or r.label) if key == "label" else str(getattr(r, key)), reverse=self.sort_reverse)
        else:
            def num(r: Any) -> float:
                if key == "ratio":
                    ri = self.ratio(r)
                    v = None if ri is None else ri.ratio
                else:
                    v = self.delta(r) if key == "delta" else getattr(r, key)
                return float("inf") if v is None else v

            rows.sort(key=num, reverse=self.sort_reverse)
        return rows

    def cells(self, r: Any) -> tuple:
        """One table row."""
        it = "-" if r.iter_mean is None else f"{r.iter_mean:.4f} ± {r.iter_std or 0:.4f}"
        delta = self.delta(r)
        is_base = r.label == self.baseline
        label = Text(r.run_name or r.label, style="bold" if is_base else "")
        if is_base and not self.per_run:
            label.append(" (base)", style="cyan")
        status = r.status + (f": {r.reason}" if r.reason else "")
        return (
            label,
            r.runs if not self.per_run else r.batch[-15:],
            it,
            fmt_num(r.tokens_per_s, ".0f"),
            fmt_bytes(r.mem_peak),
            fmt_num(r.final_loss, ".5g"),
            "base" if is_base else ("-" if delta is None else f"{delta:+.3g}"),
            Text(status[:60], style="red" if "fail" in status or "kill" in status else ""),
            "base" if is_base and not self.per_run else self.ratio_text(r),
        )

    def ratio_text(self, r: Any) -> Text:
        ri = self.ratio(r)
        if ri is None or ri.ratio is None:
            return Text("-")
        if not ri.bounded:
            return Text(f"{ri.ratio:.3f} too few repeats" if "too few" in ri.note else f"{ri.ratio:.3f} unbounded",
                        style="yellow")
        style = "green" if ri.high < 1 else "red" if ri.low > 1 else ""  # type: ignore[operator]
        return Text(f"{ri.ratio:.3f} {fmt_interval(ri.low, ri.high)}", style=style)

    def info(self) -> Text:
        """The line above the table: experiment, counts, baseline, sort and filter."""
        res = self.results
        if res is None:
            return Text("")
        if not res.experiments:
            return Text(f"no experiments in MLflow yet ({res.tracking_uri}); finished runs show up here", style="dim")
        sort_title, _ = COLUMNS[self.sort_col]
        return Text.assemble(
            (f"{res.experiment}", "bold"),
            f"  {len(res.runs)} runs, {len(res.conditions)} conditions",
            ("  baseline ", "dim"), self.baseline or "-",
            ("  sort ", "dim"), sort_title + (" ↓" if self.sort_reverse else " ↑"),
            ("  filter ", "dim") if self.filter_text else "", self.filter_text,
        )
