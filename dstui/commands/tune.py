"""`dstui tune SPEC`: the fastest DeepSpeed configuration of the spec's tune space that fits this machine.

A face over :class:`dstui.tune.session.Session`: it prints the search's
progress, the ranking and the winner's spec; the search itself (candidates,
time model, probes, resume) is the service's.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dstui.analysis.time_fit import seconds_label
from dstui.commands import _machine
from dstui.commands._common import fitted_table
from dstui.commands._tables import terminal_width
from dstui.core import exit_codes
from dstui.core.formatting import fmt_gib, fmt_sig

EPILOG = """\
The spec's `settings` give the model, data, sequence length, dtype and ranks; its `tune:` block the space
(zero_stage, offload, micro_batch, activation_checkpointing, deepcompile, sequence_parallel), the global batch
every candidate keeps, and the limits (budget_s, probe_time_box_s, ...). Candidates that cannot run or fit are
left out with the reason; the rest are ordered by a time model calibrated on this machine's runs in MLflow, and
only those that can still win are probed. Killed, the same command resumes the search.

examples:
  dstui tune configs/experiments/tune_smoke.yaml            search, print the ranking, write the winner's spec
  dstui tune configs/experiments/tune_smoke.yaml --dry-run  the candidates and their predictions; nothing launched
  dstui tune SPEC --json | jq .winner                       the outcome as one JSON document
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="experiment spec (YAML) with a `tune:` block")
    p.add_argument("--dry-run", action="store_true", help="list the candidates with predicted step time and memory; launch nothing")
    p.add_argument("--fresh", action="store_true", help="start the search over (default: resume this spec's search)")
    p.add_argument("--quiet", action="store_true", help="only the final ranking")
    p.add_argument("--json", action="store_true", help="print the outcome (or --dry-run's candidates) as one JSON document")
    p.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    from dstui.tune.session import Session

    quiet = args.quiet or _machine.active()

    def say(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr if _machine.active() else sys.stdout, flush=True)

    session = Session(args.spec, say=say, fresh=args.fresh, on_event=None if quiet else _progress)
    if args.dry_run:
        doc = session.preview()
        if _machine.active():
            _machine.emit(doc)
        else:
            print_preview(doc)
        return exit_codes.OK
    try:
        doc = session.run()
    except KeyboardInterrupt:
        print("\nstopped; the probe in flight goes on under its supervisor. The same command resumes the search.",
              file=sys.stderr)  # fmt: skip
        return exit_codes.INTERRUPTED
    if _machine.active():
        _machine.emit(doc)
    else:
        print_outcome(doc)
    return exit_codes.OK if doc.get("winner") else exit_codes.RUN_FAILED


def _progress(event: dict[str, Any]) -> None:
    """A probe's steps as they come: one line per new step (the session says the rest)."""
    if event.get("event") == "step" and event.get("mean_s"):
        half = f" ± {event['half_s'] * 1e3:.3g}" if event.get("half_s") else ""
        print(f"    {event['candidate']}: {event['steps']} steps, {event['mean_s'] * 1e3:.4g}{half} ms/step after warm-up",
              file=sys.stderr if _machine.active() else sys.stdout, flush=True)  # fmt: skip


def _ms(v: float | None) -> str:
    return "-" if v is None else fmt_sig(v * 1e3)


def print_preview(doc: dict[str, Any]) -> None:
    rows = [[r["candidate"], "-" if r["predicted_s"] is None else f"~{seconds_label(r['predicted_s'])}",
             fmt_gib(r["forecast_mem"], 1), "probed" if r["probed"] else (r["left_out"] or "candidate")]
            for r in sorted(doc["candidates"], key=lambda r: (r["left_out"] is not None, r["predicted_s"] or 0.0))]  # fmt: skip
    print(fitted_table(rows, ["candidate", "step time", "memory/GPU", "status"], terminal_width()))
    open_ = sum(1 for r in doc["candidates"] if not r["left_out"])
    print(f"\n{len(doc['candidates'])} candidates, {open_} can run here; time model: {doc['model']} ({doc['machine']})")
    print(f"exhaustive grid of the same candidates: dstui run {doc['grid_spec']}")


def print_outcome(doc: dict[str, Any]) -> None:
    rows = []
    for r in doc["ranking"]:
        measured = _ms(r["measured_s"]) + (f" ± {_ms(r['measured_half_s'])}" if r["measured_half_s"] else "")
        err = "-" if r["error_pct"] is None else f"{r['error_pct']:+.0f}%"
        rows.append([("* " if r["winner"] else "  ") + r["candidate"], _ms(r["predicted_s"]), measured, err,
                     fmt_sig(r["tokens_per_s"]) if r["tokens_per_s"] else "-", fmt_gib(r["mem_peak"], 2),
                     r["outcome"], f"{r['wall_s']:.0f}"])  # fmt: skip
    head = ["candidate", "pred ms", "measured ms", "err", "tok/s", "peak mem", "ended", "wall s"]
    print(fitted_table(rows, head, terminal_width(), drop_first=("peak mem", "err", "tok/s")))
    cost = doc["cost"]
    print(f"\n{cost['probes']} probes of {doc['candidates']} candidates ({len(doc['left_out'])} left out before any "
          f"probe, {len(doc['not_probed'])} not probed: predicted not to win); probes {cost['probe_wall_s']:.0f} s, "
          f"search {cost['search_wall_s']:.0f} s" + (f", {cost['gpu_s']:.0f} GPU-s" if cost["gpu_s"] else ""))  # fmt: skip
    print(f"stopped: {doc['stop_reason']}")
    if doc.get("winner"):
        ties = [r["candidate"] for r in doc["ranking"] if r.get("within_noise_of_winner")]
        tied = f" (not told apart from {', '.join(ties)}: their 95% intervals overlap)" if ties else ""
        print(f"winner: {doc['winner']}{tied}; its spec: dstui run {doc['winner_spec']}")
    print(f"report section: {doc['report']}")
