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
from dstui.core.terminal import printable

COLUMNS = (
    ("condition", "label"),
    ("runs", "runs"),
    ("iter s mean±std", "iter_mean"),
    ("tok/s", "tokens_per_s"),
    ("peak mem", "mem_peak"),
    ("final loss", "final_loss"),
    ("Δ loss", "delta"),
    ("time/base [95% CI]", "ratio"),
    ("status / reason", "status"),
)
# Left out first when the terminal is narrow (the rest keep their full width; status takes what is left).
DROP_ORDER = ("tokens_per_s", "delta", "runs", "ratio", "mem_peak")
DROP_ORDER_RUNS = ("tokens_per_s", "delta", "ratio", "mem_peak", "runs")  # per run, "runs" is the batch: kept longer
LABEL_MAX = 28
STATUS_MIN = len("status / reason")  # the header stays whole
PICKED, SOME_PICKED, NOT_PICKED = "● ", "◐ ", "  "


@dataclass
class View:
    """What the screen shows of loaded results: baseline, grouping, sort and filter."""

    results: Any
    baseline: str | None
    per_run: bool = False
    sort_col: int = 0
    sort_reverse: bool = False
    filter_text: str = ""
    picked: frozenset[str] = frozenset()  # run ids the user picked (across batches and experiments)

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
            terms = self.filter_text.lower().split()
            rows = [r for r in rows if all(t in self._haystack(r) for t in terms)]
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

    @staticmethod
    def _haystack(r: Any) -> str:
        return r.search_text or f"{r.label} {r.run_name} {r.batch} {r.status}".lower()

    def pick_mark(self, r: Any) -> str:
        ids = getattr(r, "run_ids", [])
        n = sum(1 for i in ids if i in self.picked)
        return NOT_PICKED if not ids or n == 0 else PICKED if n == len(ids) else SOME_PICKED

    def cell_map(self, r: Any) -> dict[str, Any]:
        """One table row, by column key."""
        it = "-" if r.iter_mean is None else f"{r.iter_mean:.4f}±{r.iter_std or 0:.4f}"
        delta = self.delta(r)
        is_base = r.label == self.baseline
        mark = self.pick_mark(r)
        label = Text()
        label.append(mark, style="bold green")
        label.append(r.run_name or r.label, style="bold" if is_base else "")
        if is_base and not self.per_run:
            label.append(" (base)", style="cyan")
        status = printable(r.status + (f": {r.reason}" if r.reason else ""), one_line=True)  # the run's own words
        return {
            "label": label,
            "runs": r.runs if not self.per_run else r.batch[-15:],
            "iter_mean": it,
            "tokens_per_s": fmt_num(r.tokens_per_s, ".0f"),
            "mem_peak": fmt_bytes(r.mem_peak),
            "final_loss": fmt_num(r.final_loss, ".5g"),
            "delta": "base" if is_base else ("-" if delta is None else f"{delta:+.3g}"),
            "ratio": "base" if is_base and not self.per_run else self.ratio_text(r),
            "status": Text(status, style="red" if "fail" in status or "kill" in status else ""),
        }

    def cells(self, r: Any) -> tuple:
        """One table row, every column (COLUMNS order)."""
        m = self.cell_map(r)
        return tuple(m[key] for _, key in COLUMNS)

    def layout(self, width: int) -> list[tuple[str, str, int]]:
        """(title, key, width) of the columns that fit ``width`` terminal columns.

        Each column gets the width of its widest cell (title included); columns are left
        out in DROP_ORDER until the rest fits with at least STATUS_MIN for the status, which
        takes whatever is left (its text is cut with … there, never the table's header).
        """
        rows = [self.cell_map(r) for r in self.rows()]

        def need(title: str, key: str) -> int:
            cells = [len(c.plain) if isinstance(c, Text) else len(str(c)) for c in (m[key] for m in rows)]
            return max([len(title), *cells])

        widths = {key: need(title, key) for title, key in COLUMNS if key != "status"}
        widths["label"] = min(widths["label"], LABEL_MAX)
        keys = [key for _, key in COLUMNS]
        pad = 2  # DataTable's cell padding, one column each side

        def total(ks: list[str]) -> int:
            return sum(widths[k] + pad for k in ks if k != "status") + STATUS_MIN + pad

        for k in DROP_ORDER_RUNS if self.per_run else DROP_ORDER:
            if total(keys) <= width:
                break
            keys.remove(k)
        status_w = max(STATUS_MIN, width - total(keys) + STATUS_MIN)
        titles = dict((key, title) for title, key in COLUMNS)
        if self.per_run:
            titles["runs"] = "batch"
        return [(titles[k], k, status_w if k == "status" else widths[k]) for k in keys]

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
            ("  picked ", "dim") if self.picked else "", f"{len(self.picked)} runs (c: chart)" if self.picked else "",
        )
