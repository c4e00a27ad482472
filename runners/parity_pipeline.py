"""Pipeline parity: DeepSpeed's pipeline engine against the same layers run unpipelined.

``compare_loss.py --pipeline-stages N`` (``pipeline_stages: N`` in a verify
spec). The model is a stack of layers a pipeline can cut anywhere (token
embedding, residual MLP blocks with RMSNorm, a norm + output projection; the
seeded init is the same on every rank), handed to
``deepspeed.pipe.PipelineModule`` with N stages and a cross-entropy
``loss_fn``. The baseline is a deep copy of the same layers as one
``torch.nn.Sequential``, trained by runners/parity_baseline.py on the same
``grad_accum`` micro-batches of every step (each data-parallel replica of the
pipeline sees its own, exactly as the data-parallel check does).

Every rank compares the parameters of its own stage, read where the optimizer
holds them (parity_applied.py, reduced over the pipeline's data-parallel
group). The gradient's shape is named for the whole model and for each stage
(a stage that repeats the GA scaling shows as ``stage 1: uniform scale =
1/GAS`` while stage 0 is rounding-level). DeepSpeed's pipeline engine takes
ZeRO stage 0 or 1; fp32 is bit-exact, bf16 gets the measured tolerance.
"""

from __future__ import annotations

import time
from typing import Any

import parity_applied
import parity_shape
import torch
import torch.distributed as dist
from parity_engine import micro_batches, module_params
from parity_session import ParitySession, sync

HIDDEN, BLOCKS = 64, 4


class Block(torch.nn.Module):
    """x + W2 gelu(W1 norm(x)): a residual block that passes one tensor, as pipeline stages must."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-5)
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Head(torch.nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(hidden, eps=1e-5)
        self.out = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def layers(vocab: int) -> list[torch.nn.Module]:
    """The layer list both sides are built from (random init from the global RNG, seeded by the caller)."""
    return [torch.nn.Embedding(vocab, HIDDEN), *(Block(HIDDEN) for _ in range(BLOCKS)), Head(HIDDEN, vocab)]


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                                             labels[:, 1:].reshape(-1))


def sequential_loss(model: Any, x: torch.Tensor) -> torch.Tensor:
    """The baseline's loss: the same layers in one forward."""
    return next_token_loss(model(x), x)


class PipelineParitySession(ParitySession):
    """ParitySession with a pipeline engine on DeepSpeed's side (see the module docstring)."""

    def build(self) -> None:
        from deepspeed.pipe import PipelineModule

        args = self.args
        self.vocab = 512
        torch.manual_seed(args.seed)
        stack = layers(self.vocab)
        baseline_layers = [torch.nn.Sequential(*(_copy(m) for m in stack)) for _ in range(2)]
        self.n_params = sum(p.numel() for m in stack for p in m.parameters())
        pipe = PipelineModule(layers=stack, num_stages=args.pipeline_stages, loss_fn=next_token_loss,
                              partition_method="uniform")
        self.loss_fn = sequential_loss
        self.model_cfg = None
        self.engine, self.client_opt = self._engine(pipe)
        self.ds_named = list(self.engine.module.named_parameters())
        self.dp_group = self.engine.grid.get_data_parallel_group()
        self.dp_rank, self.dp_world = self.engine.grid.get_data_parallel_rank(), self.engine.grid.get_data_parallel_world_size()
        self.stage_id = int(self.engine.stage_id)
        self._policy_and_baselines(baseline_layers)
        layout = parity_applied.locate(self.engine, self.ds_named, self.dp_rank)
        if layout is not None and not parity_applied.covers_every_element(layout, self.ds_named, self.device,
                                                                          group=self.dp_group):
            layout = None
        if layout is None:
            raise SystemExit("compare_loss.py: error: cannot locate the pipeline optimizer's masters "
                             f"({type(self.engine.optimizer).__name__})")
        self.applied = parity_applied.AppliedState(self.engine, layout)
        self.applied_how = layout.how
        self.tokens_per_step = self.micro * self.dp_world * self.gas * args.seq_length

    def _policy_and_baselines(self, copies: list[torch.nn.Module]) -> None:
        import parity_tolerance

        args = self.args
        exact_ok, self.why = parity_tolerance.exact_is_possible(
            dtype=self.dtype, world=self.dp_world, clip=self.clip, client_optimizer=self.client_opt is not None,
            stage=self.stage, mirror_zero3_hooks=False)
        self.policy = parity_tolerance.choose(args.tolerance, rtol=args.rtol, atol=args.atol,
                                              can_be_exact=exact_ok, why=self.why, dtype=self.dtype)
        self.measured = self.policy.mode == "measured"
        self.base = self._baseline(copies[0], coarse=False)
        self.twin = self._baseline(copies[1], coarse=True) if self.measured else None
        self.warm_steps = parity_applied.optimizer_steps(self.engine)
        for b in (self.base, self.twin):
            if b is not None:
                b.warm_start(self.warm_steps)

    def ds_side(self, xs: list[torch.Tensor], grad_scale: float) -> dict[str, Any]:
        applied = self.applied
        applied.begin_step()
        sync(self.accel)
        t0 = time.perf_counter()
        loss = self.engine.train_batch(data_iter=iter([(x, x) for x in xs]))
        sync(self.accel)
        iter_time = time.perf_counter() - t0
        params = module_params(self.ds_named, 0, masters=False)
        skipped = applied.calls == 0
        pieces, norm, before_clip = self.unclipped(applied.owned("grad"), skipped)
        grads = applied.full(pieces, self.device, group=self.dp_group)
        params.update(applied.full(applied.owned("param"), self.device, group=self.dp_group))
        return {"loss": float(loss), "grads": {} if skipped else grads, "pieces": [] if skipped else pieces,
                "params": params, "scale": 1.0, "skipped": skipped, "iter_time": iter_time, "norm": norm,
                "before_clip": before_clip}

    def train_both(self, step: int) -> tuple[dict[str, Any], Any]:
        xs = micro_batches(self.args, step, rank=self.dp_rank, world=self.dp_world, micro=self.micro,
                           gas=self.gas, vocab=self.vocab, device=self.device)
        ds = self.ds_side(xs, 1.0)
        base = self.base.step(xs, self.loss_fn)
        if not ds["before_clip"]:
            base = base.after_clipping()
        base.loss = fp32_mean(base.losses)
        mine = {n for n, _ in self.ds_named}
        ds["base_params"] = {n: p for n, p in self.base.params().items() if n in mine}
        self.twin_noise(xs, base, ds["base_params"], after_clipping=not ds["before_clip"])
        base.grads = {n: g for n, g in base.grads.items() if n in mine and not ds["skipped"]}
        base.local = {}  # one replica per data-parallel rank already: no rank-local shape to tell apart
        missing = set(ds["grads"]) ^ set(base.grads)
        if missing:
            raise RuntimeError(f"gradients present on one side only: {sorted(missing)[:5]}")
        return ds, base

    def spread_group(self) -> Any:
        return self.dp_group

    def compare(self, ds: dict[str, Any], base: Any) -> dict[str, Any]:
        """The whole model's comparison, plus the gradient's shape per pipeline stage."""
        out = super().compare(ds, base)
        mine = parity_shape.terms(ds["pieces"], base.grads, base.local, base.micro)
        tagged = torch.cat([torch.tensor([float(self.stage_id)], dtype=torch.float64), mine]).to(self.device)
        every = [torch.zeros_like(tagged) for _ in range(dist.get_world_size())]
        dist.all_gather(every, tagged)
        per_stage: dict[int, torch.Tensor] = {}
        for t in every:  # summed on the CPU: the gathered tensors are on this rank's GPU under NCCL
            sid = int(t[0].item())
            terms = t[1:].cpu()
            per_stage[sid] = per_stage.get(sid, torch.zeros_like(terms)) + terms
        shapes = []
        for sid in sorted(per_stage):
            s = parity_shape.classify(per_stage[sid].tolist(), gas=self.gas, world=self.dp_world,
                                      tol=out["l2_tol"], has_local=False)
            shapes.append(f"stage {sid}: {s.text}")
        whole = out["shape"]
        text = f"{whole.text} [{'; '.join(shapes)}]"
        out["shape"] = parity_shape.Shape(whole.ratio, whole.rel, whole.scale, whole.kind, text)
        return out


def fp32_mean(losses: list[float]) -> float:
    """The mean as the pipeline engine forms it: an fp32 running sum of the micro-batch losses, / GAS."""
    total = torch.tensor(losses[0], dtype=torch.float32)
    for loss in losses[1:]:
        total = total + loss
    return float(total / len(losses))


def _copy(module: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(module)

