"""The TUI's UI thread while it watches 30 batches x 8 runs: file I/O per tick, and its longest frame.

Issue 39.4: the Runs screen used to read batches, their supervisor locks, every
shown run's status and the bisect progress on the UI thread, every tick. Here a
real DstuiApp runs headless under Textual's Pilot on a runs home of 30 batches
of 8 runs (10 of them live: their statuses rewritten every tick/2 by a process
standing in for the supervisors, one run failing now and then), while the user
moves through the batches table every second (each move shows another
batch's runs) and opens the Live view and leaves it.

Measured on the main (UI) thread only, over the steady window after start-up:

- file I/O: Python's audit events of file access (``open``, ``os.listdir``,
  ``os.scandir``, ``fcntl.flock``, ...) plus every ``os.stat``/``os.lstat``
  (``Path.exists``/``is_file``; patched, as stat has no audit event), counted
  when the calling thread is the main thread; reported per tick;
- frames: what the UI thread computed between two wakes of a 5 ms heartbeat
  task (its CPU time: message handlers, layout and compositing included, the
  machine's load not), the longest and the 99th percentile, by what the user
  was doing; and the heartbeat's lateness in wall time, which adds the load.

Run: python benchmarks/tui_ui_thread.py [--seconds 20] [--tick 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

N_BATCHES, N_RUNS, N_LIVE = 30, 8, 10
FILE_EVENTS = ("open", "os.listdir", "os.scandir", "os.mkdir", "os.remove", "os.rename", "os.utime", "os.chmod",
               "os.kill", "os.truncate", "fcntl.flock", "fcntl.lockf", "fcntl.fcntl", "glob.glob", "glob.glob/2",
               "shutil.copyfile", "shutil.rmtree")  # fmt: skip


class MainThreadIO:
    """Counts file access made by the main thread while ``on`` (the audit hook stays installed: harmless)."""

    def __init__(self, trace: bool = False) -> None:
        self.main = threading.main_thread().ident
        self.on = False
        self.events: Counter[str] = Counter()
        self.trace = trace
        self.where: Counter[str] = Counter()  # with --trace: the innermost dstui frame of each call
        sys.addaudithook(self._audit)
        for name in ("stat", "lstat"):
            real = getattr(os, name)
            setattr(os, name, self._counted(name, real))

    def _counted(self, name: str, real):  # noqa: ANN001, ANN202
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if self.on and threading.get_ident() == self.main:
                self._count(f"os.{name}")
            return real(*args, **kwargs)

        return wrapper

    def _audit(self, event: str, args: tuple) -> None:
        if self.on and event in FILE_EVENTS and threading.get_ident() == self.main:
            self._count(event, args)

    def _count(self, event: str, args: tuple = ()) -> None:
        self.events[event] += 1
        if self.trace:  # frames walked by hand: traceback would read source lines (more opens, counted here)
            f = sys._getframe(2)
            while f is not None and "/dstui/" not in f.f_code.co_filename:
                f = f.f_back
            where = f"{f.f_code.co_filename.split('/dstui/')[-1]}:{f.f_lineno}" if f is not None else "outside dstui"
            self.where[f"{event} {where} {str(args[0])[-60:] if args else ''}"] += 1


def status(name: str, order: int, state: str, step: int, total: int = 1000) -> dict:
    now = time.time()
    return {
        "name": name, "order": order, "state": state, "steps_done": step, "steps_total": total,
        "started": now - 100, "updated": now, "warmup_steps": 2,
        "last": {"loss": 6.0 / (1 + step), "iter_time": 0.25, "tokens_per_s": 4000.0, "mem_peak": 3e9},
        "reason": "Python: RuntimeError: boom" if state == "failed" else None,
    }  # fmt: skip


def make_home(home: Path) -> None:
    """30 batches of 8 runs, newest first; the 10 newest unfinished (their runs live)."""
    from dstui.core.rundir import write_json_atomic

    t0 = time.time() - 3600
    for b in range(N_BATCHES):
        bid = f"bench{b:02d}-20260101-{b:06d}"
        path = home / "runs" / bid
        unfinished = b >= N_BATCHES - N_LIVE
        names = [f"c{i}-with-a-longer-name-{b}-r0" for i in range(N_RUNS)]
        for i, name in enumerate(names):
            rd = path / name
            rd.mkdir(parents=True)
            write_json_atomic(rd / "spec.json", {"name": name, "order": i,
                                                 "settings": {"metrics_format": "jsonl", "warmup_steps": 2}})  # fmt: skip
            write_json_atomic(rd / "status.json", status(name, i, "running" if unfinished else "done", 10 if unfinished else 1000))
            (rd / "metrics.jsonl").write_text("")
            (rd / "stdout.log").write_text("")
        write_json_atomic(path / "batch.json", {"id": bid, "experiment": "bench", "runs": names,
                                                "created": t0 + b, "finalized": not unfinished})  # fmt: skip


def supervisors(home: Path, tick: float) -> None:
    """What the supervisors of the live batches do to the folders (in a process of their own, as they
    are: not competing with the TUI for its interpreter): steps move, a run fails now and then."""
    from dstui.core.rundir import write_json_atomic

    live = sorted(p.parent for p in home.glob("runs/*/*/status.json") if '"running"' in p.read_text())
    rng = random.Random(0)
    step = 10
    while True:
        time.sleep(tick)
        step += 1
        for i, rd in enumerate(live):
            state = "failed" if rng.random() < 0.002 else "running"
            write_json_atomic(rd / "status.json", status(rd.name, i % N_RUNS, state, step))


async def measure(seconds: float, tick: float, io: MainThreadIO) -> dict:
    from dstui.tui.app import DstuiApp
    from dstui.tui.screens.live import LiveScreen

    app = DstuiApp(supervise=False, watch_s=tick)
    lags: list[tuple[float, float, str]] = []
    doing = ["watching"]  # what the user does during a stretch
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(3.0)  # start-up and the first full reads are not the steady state
        stop = asyncio.Event()

        async def heartbeat() -> None:
            while not stop.is_set():
                t, cpu = time.perf_counter(), time.thread_time()
                await asyncio.sleep(0.005)
                # wall: how late the loop came back (the machine's load adds to it); cpu: what the UI thread
                # itself computed in that stretch (handlers, layout, compositing), whatever the load
                lags.append((time.perf_counter() - t - 0.005, time.thread_time() - cpu, doing[0]))

        beat = asyncio.create_task(heartbeat())
        await pilot.press("shift+tab")  # the batches table (the runs table has the focus)
        io.on = True
        t0 = time.perf_counter()
        moves = 0
        while time.perf_counter() - t0 < seconds:
            moves += 1
            if moves % 7 == 0:  # now and then: the live view of the batch, and back
                doing[0] = "opening Live"
                await pilot.press("v")
                await pilot.pause(1.0)
                assert isinstance(app.screen, LiveScreen), app.screen
                doing[0] = "leaving Live"
                await pilot.press("escape")
                await pilot.press("shift+tab")
            else:
                doing[0] = "showing another batch"
                await pilot.press("down" if (moves // 12) % 2 == 0 else "up")
                await pilot.pause(0.3)
            doing[0] = "watching"  # the snapshots of the ticks, nothing pressed
            await pilot.pause(0.7)
        wall = time.perf_counter() - t0
        io.on = False
        stop.set()
        await beat
    return {"wall": wall, "moves": moves, "lags": lags}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--tick", type=float, default=0.5, help="the TUI's refresh interval (dstui tui's --watch)")
    ap.add_argument("--trace", action="store_true", help="say where the UI thread's file calls come from")
    ap.add_argument("--supervise-home", metavar="HOME", help=argparse.SUPPRESS)  # the writer process
    args = ap.parse_args()
    if args.supervise_home:
        supervisors(Path(args.supervise_home), args.tick / 2)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        os.environ.update(DSTUI_HOME=str(home), MLFLOW_TRACKING_URI=f"sqlite:///{home}/mlflow.db")
        os.environ.pop("DSTUI_RUNS_DIR", None)
        make_home(home)
        io = MainThreadIO(trace=args.trace)
        writer = subprocess.Popen([sys.executable, __file__, "--supervise-home", str(home), "--tick", str(args.tick)])
        try:
            out = asyncio.run(measure(args.seconds, args.tick, io))
        finally:
            writer.kill()
            writer.wait()
    ticks = out["wall"] / args.tick
    lags_ms = sorted(x[0] * 1000 for x in out["lags"])
    p99 = lags_ms[int(0.99 * (len(lags_ms) - 1))]
    total = sum(io.events.values())
    print(f"{N_BATCHES} batches x {N_RUNS} runs ({N_LIVE} batches live), {out['wall']:.0f} s, tick {args.tick:g} s "
          f"({ticks:.0f} ticks), {out['moves']} moves through the batches / into Live and back")  # fmt: skip
    print(f"UI thread file I/O: {total} calls, {total / ticks:.1f} per tick: "
          + (", ".join(f"{k} {v}" for k, v in io.events.most_common()) or "none"))
    for where, n in io.where.most_common(15):
        print(f"  {n:5d}  {where}")
    by_doing: dict[str, list[float]] = {}
    for _, cpu, what in out["lags"]:
        by_doing.setdefault(what, []).append(cpu * 1000)
    for what, values in sorted(by_doing.items()):
        values.sort()
        print(f"UI thread CPU per stretch while {what}: max {values[-1]:.1f} ms, p99 {values[int(0.99 * (len(values) - 1))]:.1f} ms, "
              f"median {statistics.median(values):.2f} ms ({len(values)} stretches)")  # fmt: skip
    runs_screen = max(by_doing.get("watching", [0.0]) + by_doing.get("showing another batch", [0.0]))
    print(f"Runs screen's longest frame (UI thread CPU): {runs_screen:.1f} ms; goal < 50 ms")
    print(f"event loop lateness (wall, the machine's load included, load average {os.getloadavg()[0]:.1f}): "
          f"max {lags_ms[-1]:.1f} ms, p99 {p99:.1f} ms, median {statistics.median(lags_ms):.2f} ms "
          f"over {len(lags_ms)} heartbeats")  # fmt: skip
    return 0 if total == 0 and runs_screen < 50 else 1


if __name__ == "__main__":
    sys.exit(main())
