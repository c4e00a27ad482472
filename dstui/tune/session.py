"""The tuning loop: prepare the candidates, resume what was probed, probe what can still win, conclude.

Each pass fits the time model on the machine's history plus every probe so
far, predicts the open candidates, and asks :func:`dstui.tune.search.decide`
for the next one. The state is saved before a probe starts and after it ends
(:mod:`dstui.tune.state`), so the loop can be killed anywhere and started
again with the same command.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dstui.analysis import forecast, time_forecast
from dstui.analysis.time_fit import Observation, Prediction, TimeModel
from dstui.analysis.time_model import Hardware, hardware_for, terms
from dstui.core import paths
from dstui.core.errors import DstuiError
from dstui.execute import backends, feasibility, sysmetrics
from dstui.execute import batch as batch_mod
from dstui.spec.experiment import ExperimentSpec
from dstui.spec.loading import load_spec
from dstui.tune import candidates as cands_mod
from dstui.tune import files, probe_rules, search, state
from dstui.tune.candidates import Candidate
from dstui.tune.probes import ProbeLauncher, ProbeRun
from dstui.tune.result import best_probe, document
from dstui.tune.state import Probe, TuneState

Say = Callable[[str], None]
Event = Callable[[dict[str, Any]], None]


@dataclass
class Machine:
    """Where the probes run: CUDA or not, the GPU's name and memory (the forecast's capacity)."""

    cuda: bool
    gpu_name: str | None
    capacity: int | None

    @classmethod
    def here(cls, spec: ExperimentSpec) -> Machine:
        gpus = sysmetrics.gpu_count()
        detected = sysmetrics.gpu_memory_total() if gpus else None
        return cls(bool(gpus), sysmetrics.gpu_name() if gpus else None, forecast.gpu_capacity(spec.gpu_memory_gib, detected))

    def hardware(self) -> Hardware:
        return hardware_for("cuda" if self.cuda else "cpu", self.gpu_name, platform.node())


@dataclass
class Session:
    """One `dstui tune SPEC`: ``run()`` returns the outcome document (:func:`dstui.tune.result.document`)."""

    spec_path: Path
    say: Say = print
    on_event: Event | None = None
    runs_root: Path | None = None
    fresh: bool = False
    poll_s: float = 0.5
    machine: Machine | None = None
    spec: ExperimentSpec = field(init=False)
    candidates: list[Candidate] = field(init=False, default_factory=list)
    folder: Path = field(init=False)
    model: TimeModel | None = field(init=False, default=None)
    memory_fit: Any = field(init=False, default=None)  # the forecast's activation fit on GPU runs (history + probes)

    def emit(self, event: str, **data: Any) -> None:
        if self.on_event is not None:
            self.on_event({"event": event, **data})

    def prepare(self) -> ProbeLauncher:
        """Candidates, their files and the planned batch (validated by DeepSpeed once, like `dstui run`)."""
        self.spec_path = Path(self.spec_path).resolve()
        file = str(self.spec_path)
        self.spec = load_spec(self.spec_path)
        opts = cands_mod.options(self.spec, file=file)
        self.machine = self.machine or Machine.here(self.spec)
        self.memory_fit = self._memory_fit(opts.history)
        self.candidates = cands_mod.build(self.spec, cuda=self.machine.cuda, capacity=self.machine.capacity, file=file,
                                          fit=self.memory_fit)  # fmt: skip
        self.folder = state.folder_for(self.spec, self.runs_root or paths.runs_dir())
        self.folder.mkdir(parents=True, exist_ok=True)
        if not any(c.open for c in self.candidates):
            raise DstuiError(f"{file}: no candidate of the tune space can run here: "
                             + "; ".join(sorted({str(c.pruned) for c in self.candidates}))[:600])  # fmt: skip
        space = files.write_space(self.folder, self.spec, self.candidates, opts)
        files.write_grid(self.folder, self.spec, self.candidates)
        plan = batch_mod.plan(space, progress=self.say)
        self._refuse_infeasible(plan)
        return ProbeLauncher(plan, runs_root=self.runs_root, poll_s=self.poll_s)

    def _memory_fit(self, use_history: bool) -> Any:
        """The activation fit on this model's earlier GPU runs (as `dstui run` forecasts); an empty one on CPU."""
        fit = forecast.ActivationFit()
        if not use_history or not self.machine or not self.machine.cuda:
            return fit
        model = str(self.spec.settings.get("model", "tiny-llama"))
        try:
            return forecast.stored_fit(paths.tracking_uri(), [model])
        except Exception:  # noqa: BLE001 - an unreadable store: the analytic forecast still works
            return fit

    def _refuse_infeasible(self, plan: batch_mod.Plan) -> None:
        """What this machine cannot run (more ranks than GPUs, ...) is left out with the check's own words."""
        machine = backends.get(plan.spec.executor).capacity()  # None: a scheduler places the runs and judges them
        problems = feasibility.problems(plan.runs, machine)
        by_cond = {r.name: r.condition for r in plan.runs}
        for prob in problems:
            cand = next((c for c in self.candidates if c.name == by_cond.get(prob.run)), None)
            if cand is not None and cand.open:
                cand.pruned = f"{prob.field}={prob.value}: {prob.reason}"

    def preview(self) -> dict[str, Any]:
        """The candidates, each predicted or said why it is out; nothing is launched (``--dry-run``)."""
        self.prepare()
        st = state.load(self.folder) or TuneState(str(self.spec_path), self.spec.name, state.search_key(self.spec))
        self._apply_learned(st)
        self.fit(st, self._history(st))
        preds = self.predictions(st, probed_too=True)  # after a search: what the calibrated model says of each
        rows = [{"candidate": c.name, "settings": cands_mod.overrides(c.choice) if c.settings else {},
                 "predicted_s": preds[c.name].seconds if c.name in preds else None,
                 "predicted_log_sd": preds[c.name].log_sd if c.name in preds else None,
                 "forecast_mem": c.memory, "left_out": c.pruned,
                 "probed": st.probe_of(c.name) is not None} for c in self.candidates]  # fmt: skip
        assert self.model is not None
        return {"experiment": self.spec.name, "folder": str(self.folder), "machine": self.model.hardware.kind,
                "model": self.model.source, "candidates": rows,
                "grid_spec": str(self.folder / state.GRID_FILE), "space_spec": str(self.folder / state.SPACE_FILE)}  # fmt: skip

    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        launcher = self.prepare()
        opts = self.spec.tune
        assert opts is not None and self.machine is not None
        with state.SearchLock(self.folder):
            st = None if self.fresh else state.load(self.folder)
            if st is None:
                st = TuneState(str(self.spec_path), self.spec.name, state.search_key(self.spec))
            self._apply_learned(st)
            self.emit("candidates", folder=str(self.folder), total=len(self.candidates),
                      open=sum(c.open for c in self.candidates), probed=len(st.probes))  # fmt: skip
            history = self._history(st)
            try:
                if st.status != "done":
                    self._search(st, launcher, history)
            finally:
                st.search_s += time.monotonic() - t0
                state.save(self.folder, st)
            doc = self._conclude(st, history)
        return doc

    def _history(self, st: TuneState) -> list[Observation]:
        opts = self.spec.tune
        assert opts is not None and self.machine is not None
        if not opts.history:
            return []
        try:
            found = time_forecast.history(paths.tracking_uri(), self.machine.hardware())
        except Exception as e:  # noqa: BLE001 - an unreadable store: the prior and the probes still work
            self.say(f"no history from MLflow ({type(e).__name__}: {e}); the time model starts from first principles")
            return []
        return [o for o in found if not st.batch or o.source != st.batch]  # this search's probes come in as probes

    def _apply_learned(self, st: TuneState) -> None:
        for c in self.candidates:
            if c.open and c.name in st.oom_pruned:
                c.pruned = st.oom_pruned[c.name]

    def _observations(self, st: TuneState, hw: Hardware) -> list[Observation]:
        by_name = {c.name: c for c in self.candidates}
        out = []
        for p in st.probes:
            c = by_name.get(p.candidate)
            if p.usable and c is not None and c.settings is not None:
                rel = p.time.rel_sd
                found = time_forecast.observation_of(c.settings, p.step_time or 0.0, rel, hw, p.candidate)
                if found:
                    out.append(found)
        return out

    def fit(self, st: TuneState, history: list[Observation]) -> TimeModel:
        assert self.machine is not None
        hw = self.machine.hardware()
        self.model = TimeModel(hw, [*history, *self._observations(st, hw)]).fit()
        return self.model

    def predictions(self, st: TuneState, *, probed_too: bool = False) -> dict[str, Prediction]:
        """The model's step time for each open candidate not probed yet (``probed_too``: for those as well)."""
        assert self.model is not None
        probed = set() if probed_too else {p.candidate for p in st.probes}
        out = {}
        for c in self.candidates:
            shape = forecast.forecastable_shape(c.settings) if c.settings is not None else None
            if c.open and c.name not in probed and shape is not None:
                out[c.name] = self.model.predict(terms(c.settings, shape, self.model.hardware))
        return out

    def _search(self, st: TuneState, launcher: ProbeLauncher, history: list[Observation]) -> None:
        opts = self.spec.tune
        assert opts is not None
        if st.in_flight:
            self._resume_in_flight(st, launcher)
        while True:
            self.fit(st, history)
            preds = self.predictions(st)
            best = best_probe(st)
            top = search.Best(best.candidate, best.time) if best else None
            measured = {p.candidate: p.time for p in st.probes if p.usable and p.step_time}
            decision = search.decide(self.candidates, preds, top, confidence=opts.confidence, margin=opts.margin,
                                     measured=measured, capacity=self.machine.capacity)
            why_not = decision.why if decision.candidate is None else self._out_of_budget(st)
            if why_not:
                st.status, st.stop_reason = "done", why_not
                self.say(f"search ends: {why_not}")
                self.emit("stop", why=why_not)
                return
            cand = next(c for c in self.candidates if c.name == decision.candidate)
            self._probe(st, launcher, cand, preds[cand.name], decision.why)

    def _out_of_budget(self, st: TuneState) -> str:
        opts = self.spec.tune
        assert opts is not None
        if opts.max_probes is not None and len(st.probes) >= opts.max_probes:
            return f"max_probes reached ({opts.max_probes})"
        spent = sum(p.wall_s for p in st.probes)
        walls = sorted(p.wall_s for p in st.probes if p.wall_s)
        expect = min(opts.probe_time_box_s, walls[len(walls) // 2]) if walls else opts.probe_time_box_s
        if spent + expect > opts.budget_s:
            return f"budget: {spent:.0f} s of {opts.budget_s:.0f} s spent; another probe takes ~{expect:.0f} s"
        return ""

    def _probe(self, st: TuneState, launcher: ProbeLauncher, cand: Candidate, pred: Prediction, why: str) -> None:
        st.probes.append(Probe(cand.name, launcher.run_name(cand.name), pred.seconds, pred.log_sd))
        st.in_flight = cand.name
        state.save(self.folder, st)  # before its run exists: a restart looks for it
        self.say(f"probe {len(st.probes)}: {cand.name}: {why}")
        self.emit("probe", candidate=cand.name, n=len(st.probes), predicted_s=pred.seconds, why=why)

        def batch_made(bid: str) -> None:
            st.batch = bid
            state.save(self.folder, st)

        launcher.start(st.batch, cand.name, on_batch=batch_made)
        self._collect(st, launcher, cand)

    def _resume_in_flight(self, st: TuneState, launcher: ProbeLauncher) -> None:
        name = st.in_flight
        cand = next((c for c in self.candidates if c.name == name), None)
        probe = st.probe_of(name or "")
        if cand is None or probe is None or not launcher.laid_out(st.batch, cand.name):
            st.probes = [p for p in st.probes if p.candidate != name]  # never launched: probed again if it can win
            st.in_flight = None
            state.save(self.folder, st)
            return
        self.say(f"following probe {name} of batch {st.batch} (started before a restart)")
        self._collect(st, launcher, cand)

    def _collect(self, st: TuneState, launcher: ProbeLauncher, cand: Candidate) -> None:
        opts = self.spec.tune
        assert opts is not None and st.batch is not None
        best = best_probe(st)
        top = best.time if best else None

        def enough(times: list[float]) -> str | None:
            return probe_rules.verdict(times, warmup=opts.warmup_steps, min_steps=opts.min_steps,
                                       precision=opts.precision, best=top)  # fmt: skip

        def progress(run: ProbeRun) -> None:
            t = probe_rules.step_time(run.times, opts.warmup_steps)
            self.emit("step", candidate=cand.name, steps=len(run.times), mean_s=t.mean if t else None,
                      half_s=t.half if t and t.half != float("inf") else None)  # fmt: skip

        run = launcher.follow(st.batch, cand.name, box_s=opts.probe_time_box_s, enough=enough, on_step=progress)
        probe = st.probe_of(cand.name)
        assert probe is not None
        files.fill_probe(probe, run, opts)
        if probe.outcome == "out of memory":
            self._teach_oom(st, cand)
        elif probe.usable and probe.mem_peak and self.machine and self.machine.cuda:
            self._teach_peak(st, cand, probe.mem_peak)
        st.in_flight = None
        state.save(self.folder, st)
        files.log_probe(probe, cand, self.folder.name)
        shown = f"{probe.step_time * 1e3:.4g} ms/step ± {probe.half * 1e3:.2g}" if probe.usable else "no step time"
        self.say(f"  {cand.name}: {probe.outcome}: {shown} (predicted {probe.predicted_s * 1e3:.4g} ms), "
                 f"{probe.wall_s:.0f} s")  # fmt: skip
        self.emit("measured", candidate=cand.name, outcome=probe.outcome, measured_s=probe.step_time,
                  half_s=probe.half, predicted_s=probe.predicted_s, wall_s=probe.wall_s)  # fmt: skip

    def _teach_oom(self, st: TuneState, cand: Candidate) -> None:
        assert self.machine is not None
        for name in search.teach_oom(self.candidates, cand, self.machine.capacity):
            c = next(x for x in self.candidates if x.name == name)
            st.oom_pruned[name] = str(c.pruned)
            self.say(f"  left out {name}: {c.pruned}")

    def _teach_peak(self, st: TuneState, cand: Candidate, peak: float) -> None:
        """A GPU probe's measured peak joins the forecast's fit; candidates that no longer fit are left out."""
        assert self.machine is not None and cand.settings is not None
        if not forecast.observe(self.memory_fit, cand.settings, peak):
            return
        probed = {p.candidate for p in st.probes}
        for c in self.candidates:
            if c.open and c.name not in probed and cands_mod.refit(c, self.machine.capacity, self.memory_fit):
                c.pruned = f"{c.pruned} (forecast refitted on the probes' measured peaks)"
                st.oom_pruned[c.name] = c.pruned
                self.say(f"  left out {c.name}: {c.pruned}")

    def _conclude(self, st: TuneState, history: list[Observation]) -> dict[str, Any]:
        assert self.machine is not None
        self.fit(st, history)
        base = cands_mod.base_settings(self.spec)
        doc = document(st, self.spec, self.candidates, self.model, ranks=base.gpus * base.nodes,
                       on_gpu=self.machine.cuda, folder=str(self.folder))  # fmt: skip
        best = best_probe(st)
        winner = next((c for c in self.candidates if best and c.name == best.candidate), None)
        doc["winner_spec"] = str(files.write_winner(self.folder, self.spec, winner)) if winner else None
        doc["report"] = str(files.write_report(self.folder, doc))
        files.log_search(launcher_parent(self.runs_root, st.batch), doc, self.folder)
        self.emit("result", **{k: doc[k] for k in ("winner", "stop_reason", "winner_spec", "report")})
        return doc


def launcher_parent(runs_root: Path | None, batch_id: str | None) -> str | None:
    """The batch's MLflow parent run id (the search's parent run)."""
    if not batch_id:
        return None
    from dstui.core.rundir import BatchDir

    return BatchDir((runs_root or paths.runs_dir()) / batch_id).info().get("mlflow_parent_run_id")
