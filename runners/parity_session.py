"""One parity run of ``compare_loss.py``: set both sides up, compare them step by step, write the verdict.

Imported by ``compare_loss.py`` after it has isolated the JIT-op cache (DeepSpeed is
imported here at module level). The parts of a step are methods of
:class:`ParitySession` so that each stays short: building the two sides, one
optimizer step of each, the comparison, the cross-rank combination, the records.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import socket
import statistics
import time
from typing import Any

import collector
import common
import deepspeed
import parity_applied
import parity_inject
import parity_patterns
import parity_shape
import parity_tolerance
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from parity import Diff, StepEvidence, divergence_reason, scalar_diff, verdict_line, worst_tensors
from parity_baseline import Baseline, BaseStep, make_torch_opt, mirror_zero3_hooks
from parity_engine import engine_step, micro_batches, module_params, rank_spread
from parity_options import adam_spec, build_model, clipping_of, dtype_of

from dstui.core.records import HEADER, STEP, SUMMARY, MetricsWriter

# --inject lr multiplies the DeepSpeed side's learning rate by this.
LR_INJECT_FACTOR = 2.0
# --inject grad scales the DeepSpeed loss before backward at --inject-step, so
# every gradient of that step is off by 1% while the reported loss is not.
GRAD_INJECT_FACTOR = 1.01
# How many tensors the summary's ``worst`` names.
WORST_TOP = 5
MAXIMA = ("loss_abs_diff", "grad_max_abs_diff", "grad_max_rel_diff", "param_max_abs_diff", "param_max_rel_diff",
          "margin")


def sync(accel: Any) -> None:
    """Wait for the device so that step times are real (a no-op on CPU)."""
    if accel.device_name() != "cpu":
        accel.synchronize()


class ParitySession:
    """DeepSpeed and its plain-PyTorch baseline, trained side by side on the same data."""

    def __init__(self, args: argparse.Namespace, cfg: dict[str, Any], writer: MetricsWriter,
                 fault: parity_inject.Fault | None, *, rank: int, world: int) -> None:
        self.args, self.cfg, self.writer, self.fault = args, cfg, writer, fault
        self.rank, self.world = rank, world
        self.accel = get_accelerator()
        self.info = common.device_info(self.accel)
        self.device = torch.device(self.accel.current_device_name())
        self.stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
        self.dtype = dtype_of(cfg)
        self.micro = int(cfg.get("train_micro_batch_size_per_gpu", args.micro_batch))
        self.gas = int(cfg.get("gradient_accumulation_steps", 1))
        self.clip = clipping_of(cfg)
        self.opt_kind, self.opt_kwargs = adam_spec(cfg, args.lr)
        self.tokens_per_step = self.micro * world * self.gas * args.seq_length
        # running state of the comparison
        self.first_step: int | None = None
        self.first_reason = ""
        self.first_worst: list[dict] = []
        self.first_shape: parity_shape.Shape | None = None
        self.ratios: list[float | None] = []
        self.worst_shape: tuple[float, str] = (-1.0, "")  # (|d-g|/|g| over its tolerance, its shape) of a PASS
        self.overall: dict[tuple[str, str], float] = {}
        self.iter_times: list[float] = []
        self.maxima = dict.fromkeys(MAXIMA, 0.0)
        self.mem_peak_max = 0
        self.final_loss = math.nan

    # -- the two sides ----------------------------------------------------------

    def build(self) -> None:
        """The model, its baseline (and twin) copies, the engine, where its masters live, the tolerance."""
        args = self.args
        torch.manual_seed(args.seed)
        # Built on its device, as train.py builds (runners/placement.py): on a GPU the init comes
        # from the device's generator, so a batch's parity and training conditions start alike.
        with contextlib.nullcontext() if self.info["on_cpu"] else self.device:
            model, self.model_cfg = build_model(args.model)
        parity_patterns.prepare(model, args.loss_pattern)
        self.loss_fn = parity_patterns.loss_fn(args.loss_pattern)
        # The baselines are copies of the initial weights taken before DeepSpeed
        # partitions, casts or moves anything.
        copies = [copy.deepcopy(model) for _ in range(2)]
        self.n_params = sum(p.numel() for p in model.parameters())
        self.engine, self.client_opt = self._engine(model)
        self.ds_named = list(self.engine.module.named_parameters())
        exact_ok, self.why = parity_tolerance.exact_is_possible(
            dtype=self.dtype, world=self.world, clip=self.clip, client_optimizer=self.client_opt is not None,
            stage=self.stage, mirror_zero3_hooks=args.mirror_zero3_hooks)
        self.policy = parity_tolerance.choose(args.tolerance, rtol=args.rtol, atol=args.atol,
                                              can_be_exact=exact_ok, why=self.why, dtype=self.dtype)
        self.measured = self.policy.mode == "measured"
        self.base = self._baseline(copies[0], coarse=False)
        self.twin = self._baseline(copies[1], coarse=True) if self.measured else None  # it only measures noise
        self.warm_steps = parity_applied.optimizer_steps(self.engine)
        for b in (self.base, self.twin):
            if b is not None:
                b.warm_start(self.warm_steps)
        layout = parity_applied.locate(self.engine, self.ds_named, self.rank)
        if layout is not None and not parity_applied.covers_every_element(layout, self.ds_named, self.device):
            layout = None
        self.applied = parity_applied.AppliedState(self.engine, layout) if layout is not None else None
        self.applied_how = layout.how if layout is not None else "public API (safe_get_full_grad/fp32_param)"

    def engine_dtypes(self) -> tuple[torch.dtype, dict[str, torch.dtype]]:
        """(parameter dtype, buffer dtypes) of the engine's module: what the baseline must compute in."""
        floats = [p.dtype for _, p in self.ds_named if p.is_floating_point()]
        buffers = {n: b.dtype for n, b in self.engine.module.named_buffers() if b.is_floating_point()}
        return (floats[0] if floats else torch.float32), buffers

    def dtypes_note(self) -> dict[str, str]:
        """The dtypes the baseline copied from the engine's module (its parameters, each distinct buffer dtype)."""
        param_dtype, buffers = self.engine_dtypes()
        return {"params": str(param_dtype), **{f"buffer {n}": str(d) for n, d in list(buffers.items())[:8]}}

    def _baseline(self, copy_: torch.nn.Module, *, coarse: bool) -> Baseline:
        copy_ = copy_.to(self.device)
        # Under ZeRO-3 the other legitimate grouping of gradient sums is ZeRO-3's own (its module hooks):
        # a twin without it measured no noise at 2 ranks and grad_accum 1 (bit-identical to the baseline),
        # and ZeRO-3's ulp-level gradient differences, which Adam turns into 1e-6 parameter differences,
        # then failed a correct release (benchmarks/verify_self_compare.py, fp32 seed 3).
        if self.args.mirror_zero3_hooks or (coarse and self.stage == 3):
            mirror_zero3_hooks(copy_)
        if self.args.compile:
            copy_ = torch.compile(copy_)
        param_dtype, buffers = self.engine_dtypes()
        return Baseline(copy_, param_dtype=param_dtype, buffer_dtypes=buffers, opt_kind=self.opt_kind,
                        opt_kwargs=self.opt_kwargs, clip=self.clip,
                        reduce="micro" if self.stage >= 2 else "boundary", coarse=coarse, explain=not coarse)

    def _engine(self, model: torch.nn.Module) -> tuple[Any, Any]:
        ds_cfg = copy.deepcopy(self.cfg)
        ds_kwargs = dict(self.opt_kwargs)
        if self.args.inject == "lr":
            ds_kwargs["lr"] = self.opt_kwargs["lr"] * LR_INJECT_FACTOR
            if ds_cfg.get("optimizer"):
                ds_cfg["optimizer"].setdefault("params", {})["lr"] = ds_kwargs["lr"]
        trainable = [p for p in model.parameters() if p.requires_grad]
        client_opt = None if ds_cfg.get("optimizer") else make_torch_opt(trainable, self.opt_kind, ds_kwargs)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                               optimizer=client_opt, config=ds_cfg)
        if self.fault is not None:
            parity_inject.install(engine, self.fault)
        if self.args.compile:
            engine.compile()
        return engine, client_opt

    def write_header(self) -> None:
        if self.rank != 0:
            return
        args, policy = self.args, self.policy
        inject = self.fault.kind if self.fault else args.inject
        self.writer.write(
            HEADER, runner="compare_loss",
            config={**vars(args), "world_size": self.world, "zero_stage": self.stage, "dtype": self.dtype,
                    "grad_accum": self.gas},
            ds_config=self.cfg, versions=common.versions(), deepspeed_git_sha=common.deepspeed_git_sha(),
            device=self.info["device"], gpu_name=self.info["gpu_name"], gpu_count=self.info["gpu_count"],
            world_size=self.world, hostname=socket.gethostname(), tokens_per_step=self.tokens_per_step,
            params=self.n_params, flops_per_token=6 * self.n_params, peak_tflops=None,
            baseline_optimizer={"type": self.opt_kind, **self.opt_kwargs}, gradient_clipping=self.clip,
            tolerance_mode=policy.mode, inject=inject, applied=self.applied_how, loss_pattern=args.loss_pattern,
            optimizer_steps_at_start=self.warm_steps, baseline_dtypes=self.dtypes_note(),
        )
        client = "client " if self.client_opt is not None else ""
        print(f"compare_loss: ZeRO-{self.stage} {self.dtype} world={self.world} grad_accum={self.gas} "
              f"clip={self.clip:g} model={args.model} optimizer={client}{self.opt_kind} "
              f"tolerance={policy.mode}{' (' + self.why + ')' if self.why else ''} inject={inject} "
              f"applied={self.applied_how} loss={args.loss_pattern}", flush=True)
        if self.warm_steps:
            print(f"compare_loss: DeepSpeed's optimizer took {self.warm_steps} step(s) on zero gradients at start-up "
                  "(Adam's bias correction starts later); the baseline does the same", flush=True)

    # -- one step -----------------------------------------------------------------

    def ds_side(self, xs: list[torch.Tensor], grad_scale: float) -> dict[str, Any]:
        """One DeepSpeed step: its loss, the gradient its optimizer applied, the state it holds after."""
        applied = self.applied
        if applied is not None:
            applied.begin_step()
        trainable = [(n, p) for n, p in self.ds_named if p.requires_grad]
        sync(self.accel)
        t0 = time.perf_counter()
        es = engine_step(self.engine, xs, self.loss_fn, dtype=self.dtype, grad_scale=grad_scale,
                         public_grads_of=None if applied is not None else trainable)
        sync(self.accel)
        iter_time = time.perf_counter() - t0
        params = module_params(self.ds_named, self.stage, masters=applied is None)
        if applied is not None:
            pieces, norm, before_clip = self.unclipped(applied.owned("grad"), es.skipped)
            grads = applied.full(pieces, self.device)
            params.update(applied.full(applied.owned("param"), self.device))
        else:  # read after the last backward, before the step: already before clipping
            grads = es.public_grads
            pieces = [(n, 0, g.reshape(-1)) for n, g in grads.items()]
            norm, before_clip = parity_applied.as_norm(self.engine.get_global_grad_norm()), True
        if es.skipped:
            grads, pieces = {}, []
        return {"loss": es.loss, "grads": grads, "pieces": pieces, "params": params, "scale": es.scale,
                "skipped": es.skipped, "iter_time": iter_time, "norm": norm, "before_clip": before_clip}

    def unclipped(self, pieces: list[tuple[str, int, torch.Tensor]], skipped: bool
                  ) -> tuple[list[tuple[str, int, torch.Tensor]], float | None, bool]:
        """(this rank's gradient pieces before clipping, DeepSpeed's pre-clip norm, whether they are before it).

        The optimizer's pre-hook sees the clipped gradient; DeepSpeed's own coefficient
        (from the norm it reported) is divided out. Without a norm they stay clipped and the
        baseline is compared after clipping too (False).
        """
        norm = self.applied.pre_clip_norm() if self.applied is not None else None
        if self.clip <= 0 or skipped:
            return pieces, norm, True
        if norm is None:
            return pieces, None, False
        c = parity_applied.clip_coefficient(norm, self.clip)
        return ([(n, s, t / c) for n, s, t in pieces] if c != 1.0 else pieces), norm, True

    def train_both(self, step: int) -> tuple[dict[str, Any], BaseStep]:
        """One optimizer step of DeepSpeed and of the baseline(s): (deepspeed side, baseline step)."""
        args = self.args
        xs = micro_batches(args, step, rank=self.rank, world=self.world, micro=self.micro, gas=self.gas,
                           vocab=int(self.model_cfg.vocab_size), device=self.device)
        grad_scale = GRAD_INJECT_FACTOR if args.inject == "grad" and step == args.inject_step else 1.0
        ds = self.ds_side(xs, grad_scale)
        base = self.base.step(xs, self.loss_fn, loss_scale=ds["scale"], skip=ds["skipped"])
        if not ds["before_clip"]:
            base = base.after_clipping()
        ds["base_params"] = self.base.params()
        self.twin_noise(xs, base, ds["base_params"], loss_scale=ds["scale"], skip=ds["skipped"],
                        after_clipping=not ds["before_clip"])
        if ds["skipped"]:
            base.grads = {}
        missing = set(ds["grads"]) ^ set(base.grads)
        if missing:
            raise RuntimeError(f"gradients present on one side only: {sorted(missing)[:5]}")
        return ds, base

    def twin_noise(self, xs: list[torch.Tensor], base: BaseStep, base_params: dict[str, torch.Tensor], *,
                   loss_scale: float = 1.0, skip: bool = False, after_clipping: bool = False) -> None:
        """The twin's step and how far it lands from the baseline's: the noise the tolerance is made of."""
        if self.twin is None:
            return
        twin = self.twin.step(xs, self.loss_fn, loss_scale=loss_scale, skip=skip)
        if after_clipping:
            twin = twin.after_clipping()
        twin_params = self.twin.params()
        noise = self.policy.noise
        noise.observe("loss", [(torch.tensor(twin.loss), torch.tensor(base.loss))])
        noise.observe("grad", [(twin.grads[n], g) for n, g in base.grads.items()])
        noise.observe("param", [(twin_params[n], p) for n, p in base_params.items()])
        noise.observe_l2(twin.grads, base.grads)

    def compare(self, ds: dict[str, Any], base: BaseStep) -> dict[str, Any]:
        """This rank's differences, the gradient's shape and the ranks' agreement (collectives)."""
        policy = self.policy
        rtol = policy.rtol_for()
        loss_atol = policy.atol_for("loss", torch.tensor(base.loss))
        loss_d, loss_ok = scalar_diff(ds["loss"], base.loss, rtol, loss_atol)
        diffs = {"grad": Diff(), "param": Diff()}
        for kind, ref in (("grad", base.grads), ("param", ds["base_params"])):
            for n, t in ds[kind + "s"].items():
                diffs[kind].add(n, t, ref[n], rtol, policy.atol_for(kind, ref[n]))
        sums = parity_shape.terms(ds["pieces"], base.grads, base.local, base.micro).to(self.device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        tol = policy.l2_tol()
        shape = parity_shape.classify(sums.tolist(), gas=self.gas, world=self.world, tol=tol,
                                      has_local=bool(base.local))
        spread = rank_spread([*ds["grads"].values(), *ds["params"].values()], self.device, self.spread_group())
        allowed = loss_atol + rtol * abs(base.loss)
        loss_ratio = 0.0 if loss_d == 0 else (loss_d / allowed if allowed > 0 else math.inf)
        l2_ratio = 0.0 if not shape.rel or math.isnan(shape.rel) else (shape.rel / tol if tol > 0 else math.inf)
        norm = self.norm_check(ds, base)
        norm_ratio = 0.0 if norm is None or norm[2] == 0 else (norm[2] / norm[3] if norm[3] > 0 else math.inf)
        return {"loss_d": loss_d, "loss_ok": loss_ok, "loss_tol": allowed, "diffs": diffs, "shape": shape, "spread": spread,
                "l2_tol": tol, "norm": norm, "norm_ok": norm is None or not norm[2] > norm[3],
                "margin_local": max(loss_ratio, l2_ratio, norm_ratio, diffs["grad"].max_ratio,
                                    diffs["param"].max_ratio)}

    def norm_check(self, ds: dict[str, Any], base: BaseStep) -> tuple[float, float, float, float] | None:
        """(DeepSpeed's pre-clip norm, the baseline's, their |d|/|g|, its tolerance) where the norm sets clipping.

        Gradients compared before clipping cannot see a wrong norm: it only changes the
        clipping coefficient, to which Adam is nearly blind. The tolerance is the whole
        gradient's: ``| |d| - |g| | <= |d - g|``.
        """
        if self.clip <= 0 or ds["skipped"] or ds["norm"] is None or not base.norm > 0:
            return None
        return ds["norm"], base.norm, abs(ds["norm"] - base.norm) / base.norm, self.policy.l2_tol()

    def spread_group(self) -> Any:
        """The ranks that hold the same tensors: all of them here, a stage's data-parallel group in a pipeline."""
        return None

    def record(self, step: int, ds: dict[str, Any], base: BaseStep, cmp: dict[str, Any]) -> dict[str, Any]:
        """The step record, combined over ranks: means of losses, maxima of differences."""
        gdiff, pdiff, shape = cmp["diffs"]["grad"], cmp["diffs"]["param"], cmp["shape"]
        l2_ok = not (shape.rel > cmp["l2_tol"]) and cmp["spread"] == 0.0 and cmp["norm_ok"]
        sums = torch.tensor([ds["loss"], base.loss], dtype=torch.float64, device=self.device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        worst = torch.tensor([cmp["loss_d"], gdiff.max_abs, gdiff.max_rel, pdiff.max_abs, pdiff.max_rel,
                              cmp["margin_local"], float(not cmp["loss_ok"]), float(not (gdiff.ok and l2_ok)),
                              float(not pdiff.ok)], dtype=torch.float64, device=self.device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        w = worst.tolist()
        mem_alloc, mem_peak = common.memory(self.accel, self.info["on_cpu"])
        self.mem_peak_max = max(self.mem_peak_max, mem_peak)
        self.final_loss = sums[0].item() / self.world
        grad_norm = self.engine.get_global_grad_norm()
        iter_time = ds["iter_time"]
        rec: dict[str, Any] = {
            "step": step, "epoch": 1, "loss": self.final_loss, "loss_baseline": sums[1].item() / self.world,
            "loss_diff": (sums[0].item() - sums[1].item()) / self.world, "loss_abs_diff": w[0],
            "grad_max_abs_diff": w[1], "grad_max_rel_diff": w[2],
            "param_max_abs_diff": w[3], "param_max_rel_diff": w[4], "margin": _finite(w[5]),
            "loss_within_tol": int(not w[6]), "grad_within_tol": int(not w[7]),
            "param_within_tol": int(not w[8]), "within_tol": int(not any(w[6:])),
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
            "grad_norm_baseline": base.norm, "grad_norm_ratio": _finite(shape.ratio),
            "grad_norm_rel_diff": _finite(cmp["norm"][2]) if cmp["norm"] else None,
            "grad_l2_rel_diff": _finite(shape.rel), "grad_l2_tol": cmp["l2_tol"],
            "grad_scale_fit": _finite(shape.scale), "rank_spread": cmp["spread"], "skipped": int(ds["skipped"]),
            "iter_time": iter_time, "tokens_per_s": self.tokens_per_step / iter_time if iter_time > 0 else 0.0,
            "mem_alloc": mem_alloc, "mem_peak": mem_peak, "lr": float(self.engine.get_lr()[0]),
        }
        if self.measured:
            rec.update({f"noise_{k}_rel": v for k, v in self.policy.noise.rel.items()})
            rec["noise_grad_l2_rel"] = self.policy.noise.l2
        return rec

    def account(self, step: int, rec: dict[str, Any], cmp: dict[str, Any]) -> None:
        """Fold a step into the run's maxima, worst tensors and first divergence; print its lines."""
        diffs, shape = cmp["diffs"], cmp["shape"]
        self.iter_times.append(rec["iter_time"])
        self.ratios.append(rec["grad_norm_ratio"])
        closeness = shape.rel / cmp["l2_tol"] if cmp["l2_tol"] > 0 else (math.inf if shape.rel else 0.0)
        if not math.isnan(closeness) and closeness > self.worst_shape[0]:
            self.worst_shape = (closeness, shape.text)
        for k in self.maxima:
            self.maxima[k] = max(self.maxima[k], rec[k] if rec[k] is not None else math.inf)
        for kind, d in diffs.items():
            for name, m in d.per_tensor:
                self.overall[(kind, name)] = max(self.overall.get((kind, name), 0.0), m)
        if not rec["within_tol"] and self.first_step is None:
            self.first_step = step
            self.first_shape = shape
            self.first_worst = worst_tensors(diffs, WORST_TOP, offenders_only=True)
            self.first_reason = divergence_reason(self.evidence(rec, cmp))
            if self.rank == 0:
                for what, d in diffs.items():
                    for name, dmax, bad, n in sorted(d.offenders, key=lambda o: -o[1])[:24]:
                        print(f"  {what} {name}: max|d| {dmax:.3e}, {bad}/{n} elements out of tolerance",
                              flush=True)
        if self.rank == 0:
            self.writer.write(STEP, **{k: v for k, v in rec.items() if v is not None})
            print(f"step {step}/{self.args.steps} loss {rec['loss']:.6f} baseline {rec['loss_baseline']:.6f} "
                  f"|dloss| {rec['loss_abs_diff']:.3e} grad |d| {rec['grad_max_abs_diff']:.3e} "
                  f"param |d| {rec['param_max_abs_diff']:.3e} {shape.text} margin {rec['margin'] if rec['margin'] is not None else math.inf:.3g} "
                  f"{'ok' if rec['within_tol'] else 'DIVERGED'}", flush=True)
            print(f"Epoch 1, Step {step}, Loss: {rec['loss']:.6f} sync: True time: {rec['iter_time']:.6f} "
                  f"alloc_mem: {rec['mem_alloc']} peak_mem: {rec['mem_peak']}", flush=True)

    def evidence(self, rec: dict[str, Any], cmp: dict[str, Any]) -> StepEvidence:
        """What a diverging step's reason states: the shape, and each failed check with its tolerance."""
        shape = cmp["shape"]
        tensors = tuple((kind, d.ratio_name, d.ratio_abs, d.ratio_tol) for kind, d in cmp["diffs"].items() if not d.ok)
        return StepEvidence(
            shape=shape.text if shape.kind != "no gradient" else "",
            rank_spread=rec["rank_spread"],
            loss=None if rec["loss_within_tol"] else (rec["loss_abs_diff"], cmp["loss_tol"]),
            l2=(shape.rel, cmp["l2_tol"]) if shape.rel > cmp["l2_tol"] else None,
            norm=None if cmp["norm_ok"] else cmp["norm"],
            tensors=tensors)

    # -- the run --------------------------------------------------------------------

    def run(self) -> int:
        """Train both sides for ``args.steps`` steps; return the exit code (0 PASS, 1 FAIL)."""
        self.build()
        collector.resume()  # paused by compare_loss.py while it started (runners/collector.py)
        self.write_header()
        for step in range(1, self.args.steps + 1):
            ds, base = self.train_both(step)
            cmp = self.compare(ds, base)
            self.account(step, self.record(step, ds, base, cmp), cmp)
        verdict = "PASS" if self.first_step is None else "FAIL"
        if self.rank == 0:
            self.write_summary(verdict)
        return 0 if verdict == "PASS" else 1

    def write_summary(self, verdict: str) -> None:
        policy = self.policy
        top = sorted(self.overall.items(), key=lambda kv: -kv[1])[:WORST_TOP]
        mean_time = statistics.fmean(self.iter_times)
        shape = self.first_shape
        self.writer.write(
            SUMMARY, steps=self.args.steps, warmup_steps=0,
            iter_time_mean=mean_time, iter_time_std=statistics.pstdev(self.iter_times),
            # total tokens / total time, as train.py's summary and the report (not a mean of per-step rates)
            tokens_per_s_mean=self.tokens_per_step / mean_time if mean_time > 0 else 0.0,
            compile_time=self.iter_times[0] if self.args.compile else 0.0, mem_peak_max=self.mem_peak_max,
            final_loss=self.final_loss, verdict=verdict, first_diverging_step=self.first_step,
            reason=self.first_reason or None,
            worst=self.first_worst if self.first_step else [
                {"name": n, "kind": k, "max_abs_diff": v} for (k, n), v in top if v > 0],
            tolerance=policy.tolerance(), tolerance_basis=policy.basis(), tolerance_mode=policy.mode,
            rtol=policy.rtol_for(), atol=policy.atol if policy.mode == "given" else 0.0,
            grad_norm_ratios=self.ratios, grad_shape=(shape.text if shape else self.worst_shape[1]),
            grad_shape_kind=(shape.kind if shape else "rounding-level"), applied=self.applied_how,
            loss_pattern=self.args.loss_pattern,
            **{f"{k}_max": _finite(v) for k, v in self.maxima.items()}, status="ok",
        )
        print(f"tolerance: {policy.basis()}", flush=True)
        print(verdict_line(self.first_step, self.first_reason), flush=True)


def _finite(x: float) -> float | None:
    """NaN/inf become None (left out of the record): JSON and MLflow handle them badly."""
    return x if math.isfinite(x) else None
