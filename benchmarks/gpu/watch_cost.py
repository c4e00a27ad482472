#!/usr/bin/env python
"""Cost of watching: the same training job with and without dstui's supervision.

``W`` runs go through ``python -m dstui run SPEC`` (detached supervisor, system
metrics sampled every 2 s, every step record streamed to MLflow, the foreground
follower printing progress). ``B`` runs start the very argv that dstui wrote to
the first W run's ``cmd.txt`` (same ds_config.json, same runner flags) straight
from DeepSpeed's launcher, with nothing watching. The runner writes its
metrics.jsonl in both, so its own step timing is the measurement.

The order is balanced (default W B B W W B) so that drift of the machine cannot
pose as a cost. Peak memory is compared twice: torch's max_memory_allocated
(from the runner's summary) and the largest NVML ``memory.used`` per GPU seen
while the run was alive (sampled here at 4 Hz for both kinds of run alike).

    python benchmarks/gpu/watch_cost.py --spec benchmarks/gpu/watch.yaml --out OUTDIR
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dstui.execute.launch import free_port  # noqa: E402


class NvmlPeak(threading.Thread):
    """Largest memory.used per GPU between start() and stop()."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak: dict[int, float] = {}
        self._stop_ev = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.n = pynvml.nvmlDeviceGetCount()
        except Exception:  # noqa: BLE001 - no GPU: no readings
            self.nv, self.n = None, 0

    def run(self) -> None:
        while not self._stop_ev.is_set():
            for i in range(self.n):
                try:
                    used = self.nv.nvmlDeviceGetMemoryInfo(
                        self.nv.nvmlDeviceGetHandleByIndex(i)
                    ).used
                except Exception:  # noqa: BLE001
                    continue
                self.peak[i] = max(self.peak.get(i, 0.0), float(used))
            self._stop_ev.wait(self.interval)

    def stop(self) -> dict[int, float]:
        self._stop_ev.set()
        self.join(timeout=2)
        return self.peak


def read_metrics(path: Path) -> dict:
    steps, summary, header = [], {}, {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "step":
                steps.append(rec)
            elif rec.get("type") == "summary":
                summary = rec
            elif rec.get("type") == "header":
                header = rec
    return {"steps": steps, "summary": summary, "header": header}


def newest_batch(runs_dir: Path, experiment: str, before: set[str]) -> Path | None:
    cands = [p for p in runs_dir.glob(f"{experiment}-*") if p.is_dir() and p.name not in before]
    return max(cands, key=lambda p: p.stat().st_mtime) if cands else None


def replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    i = out.index(flag)
    out[i + 1] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--spec", default=str(REPO / "benchmarks" / "gpu" / "watch.yaml"))
    p.add_argument("--order", default="WBBWWB", help="W = through dstui, B = bare launcher")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="unix time: start no run that would not end before it (judged by the longest so far)",
    )
    a = p.parse_args(argv)

    import yaml

    from dstui.core import paths

    experiment = yaml.safe_load(Path(a.spec).read_text())["name"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = paths.runs_dir()
    runs_dir.mkdir(parents=True, exist_ok=True)
    template: list[str] | None = None
    cwd: str | None = None
    rows = []
    longest = 0.0
    for i, mode in enumerate(a.order):
        if a.deadline and rows and time.time() + 1.15 * longest > a.deadline:
            print(f"[watch_cost] stopping before run {i}: the deadline is near", flush=True)
            break
        if mode == "B" and template is None:
            raise SystemExit("the order must start with W (the bare runs reuse its argv)")
        sampler = NvmlPeak()
        sampler.start()
        t0 = time.time()
        if mode == "W":
            before = {q.name for q in runs_dir.glob(f"{experiment}-*")}
            proc = subprocess.run(
                [sys.executable, "-m", "dstui", "run", a.spec, "--quiet"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=a.timeout,
            )  # fmt: skip
            wall = time.time() - t0
            batch = newest_batch(runs_dir, experiment, before)
            if batch is None:
                raise SystemExit(f"dstui run made no batch:\n{proc.stdout[-3000:]}")
            rd = next(q for q in batch.iterdir() if (q / "status.json").is_file())
            metrics_file = rd / "metrics.jsonl"
            if template is None:
                template = shlex.split((rd / "cmd.txt").read_text())
                cwd = json.loads((batch / "batch.json").read_text()).get("cwd") or str(rd)
            state = json.loads((rd / "status.json").read_text()).get("state")
            log_tail = proc.stdout[-400:]
        else:
            run_dir = out / f"bare-{i}"
            run_dir.mkdir(parents=True, exist_ok=True)
            metrics_file = run_dir / "metrics.jsonl"
            argv_b = replace_flag(template, "--metrics-file", str(metrics_file))
            # DeepSpeed's launcher spells it --master_port, dstui's own rank starter --master-port
            port_flag = "--master-port" if "--master-port" in argv_b else "--master_port"
            argv_b = replace_flag(argv_b, port_flag, str(free_port()))
            (run_dir / "cmd.txt").write_text(shlex.join(argv_b) + "\n")
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            with open(run_dir / "stdout.log", "wb") as log:
                rc = subprocess.run(
                    argv_b, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                    start_new_session=True, timeout=a.timeout,
                ).returncode  # fmt: skip
            wall = time.time() - t0
            state = "done" if rc == 0 else f"exit {rc}"
            log_tail = (run_dir / "stdout.log").read_text(errors="replace")[-400:]
        peak = sampler.stop()
        longest = max(longest, wall)
        m = read_metrics(metrics_file)
        s = m["summary"]
        warm = int(s.get("warmup_steps", 0) or 0)
        timed = [r["iter_time"] for r in m["steps"] if r["step"] > warm]
        row = {
            "i": i, "mode": mode, "state": state, "wall_s": wall, "metrics": str(metrics_file),
            "iter_time_mean": s.get("iter_time_mean"), "iter_time_std": s.get("iter_time_std"),
            "iter_time_median": statistics.median(timed) if timed else None,
            "step_times": timed, "mem_peak_max": s.get("mem_peak_max"),
            "nvml_used_peak": peak, "final_loss": s.get("final_loss"),
            "losses": [r.get("loss") for r in m["steps"]],
        }  # fmt: skip
        if not s:
            row["log_tail"] = log_tail
        rows.append(row)
        print(
            f"[watch_cost] {i} {mode} {state} wall {wall:.1f}s iter {row['iter_time_mean']} "
            f"mem_peak {row['mem_peak_max']} nvml_peak {peak}",
            flush=True,
        )

    res = {"bench": "watch_cost", "spec": a.spec, "order": a.order, "runs": rows}
    res.update(compare(rows))
    (out / "watch_cost.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1), flush=True)
    return 0


def compare(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["iter_time_mean"]]
    w = [r for r in ok if r["mode"] == "W"]
    b = [r for r in ok if r["mode"] == "B"]
    if not w or not b:
        return {"verdict": "incomplete"}
    wm = statistics.fmean(r["iter_time_mean"] for r in w)
    bm = statistics.fmean(r["iter_time_mean"] for r in b)
    wmed = statistics.fmean(r["iter_time_median"] for r in w)
    bmed = statistics.fmean(r["iter_time_median"] for r in b)
    ws = [t for r in w for t in r["step_times"]]
    bs = [t for r in b for t in r["step_times"]]
    pval = None
    try:
        from scipy import stats

        pval = float(stats.ttest_ind(ws, bs, equal_var=False).pvalue)
    except Exception:  # noqa: BLE001 - scipy is optional here
        pass
    mem_w = {r["mem_peak_max"] for r in w}
    mem_b = {r["mem_peak_max"] for r in b}

    def nv_max(rs: list[dict]) -> dict:
        out: dict = {}
        for r in rs:
            for k, v in r["nvml_used_peak"].items():
                out[str(k)] = max(out.get(str(k), 0.0), v)
        return out

    return {
        "watched_iter_time_mean": wm,
        "bare_iter_time_mean": bm,
        "ratio_mean": wm / bm,
        "ratio_median": wmed / bmed,
        "pooled_steps": [len(ws), len(bs)],
        "welch_p": pval,
        "watched_run_means": [r["iter_time_mean"] for r in w],
        "bare_run_means": [r["iter_time_mean"] for r in b],
        "mem_peak_watched": sorted(mem_w),
        "mem_peak_bare": sorted(mem_b),
        "nvml_used_peak_watched": nv_max(w),
        "nvml_used_peak_bare": nv_max(b),
        "losses_identical": len({json.dumps(r["losses"]) for r in ok}) == 1,
        "verdict": "ok" if wm / bm <= 1.01 and mem_w == mem_b else "check",
    }


if __name__ == "__main__":
    sys.exit(main())
