"""One DeepSpeed engine plus the data it eats: model building, engine set-up, batches, one step."""

from __future__ import annotations

import argparse
import time
from typing import Any

import collector
import common
import corpus
import placement
from common import RunnerError
from phases import PhaseClock
from sp_probe import Probe, capture

from dstui.core.hardware import flops_per_token, peak_tflops
from dstui.spec import dsconfig


def compile_mode(args: argparse.Namespace, sp: int) -> str:
    """How the engine runs: "deepcompile", "compile" or "eager" (ring attention runs eager)."""
    if args.deepcompile or (sp > 1 and args.sp_mode == "deepcompile"):
        return "deepcompile"
    if args.compile or (sp > 1 and args.sp_mode == "compile"):
        return "compile"
    return "eager"


def sp_impl(args: argparse.Namespace) -> Any:
    """The module of the sequence-parallel mode: ring attention or Ulysses (eager, compile, DeepCompile)."""
    if args.sp_mode == "ring":
        import ring

        return ring
    import ulysses

    return ulysses


class Trainer:
    """One DeepSpeed engine plus the data it eats and the numbers it produces."""

    def __init__(
        self,
        args: argparse.Namespace,
        ds_config: dict[str, Any],
        *,
        use_sp: bool,
        clock: PhaseClock | None = None,
        probe: Probe | None = None,
        reference: bool = False,
    ) -> None:
        """``reference``: the sp-check's no-SP run, fed whole micro batches in the order the SP groups saw them."""
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        self.args = args
        self.reference = reference
        self.accel = get_accelerator()
        self.dev = common.device_info(self.accel)
        self.rank = deepspeed.comm.get_rank()
        self.world = deepspeed.comm.get_world_size()
        self.sp = args.sequence_parallel if use_sp else 1
        if self.world % self.sp:
            raise RunnerError(
                f"--sequence-parallel {self.sp} does not divide the {self.world} ranks"
            )
        self.dp = self.world // self.sp

        common.seed_all(args.seed)
        config = common.model_config(args.model)
        self.layers, self.hidden, heads, kv_heads, self.vocab = common.arch(config)
        self.heads, self.kv_heads = heads, kv_heads  # the header's model_shape
        # Seq2seq (T5-style): the encoder reads the block, the decoder learns to reproduce it
        # (labels = the block; the model shifts them into decoder inputs itself).
        self.seq2seq = common.is_seq2seq(config)
        if self.seq2seq and self.sp > 1:
            raise RunnerError(
                "--sequence-parallel needs a causal LM; this model is encoder-decoder"
            )
        if hasattr(config, "use_cache"):
            config.use_cache = False  # a KV cache is useless in training and costs memory
        mpu = self._attention(config, probe)
        self.compile_mode = compile_mode(args, self.sp)
        self.ds_config = cfg = self._engine_config(ds_config)

        # on its device; under ZeRO-3 partitioned while it is built (runners/placement.py)
        model, self.model_init = placement.build(
            args, config, cfg, accel=self.accel, on_cpu=self.dev["on_cpu"], mpu=mpu
        )
        if args.activation_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.params = self.model_init["params"]
        if clock is not None:
            clock.mark("model_built")

        self._initialize(model, cfg, mpu)
        self.micro_batch = self.engine.train_micro_batch_size_per_gpu()
        self.grad_accum = self.engine.gradient_accumulation_steps()
        self.tokens_per_step = self.micro_batch * self.grad_accum * args.seq_length * self.dp
        self.flops_per_token = flops_per_token(
            self.params, self.layers, self.hidden, args.seq_length
        )
        self.peak = peak_tflops(self.dev["gpu_name"], args.dtype)
        self.device = self.accel.current_device_name()
        self.batches = self._data()
        if probe is not None:  # eager, before compile: the compiled graphs are those of a run without it
            rng = [] if self.dev["on_cpu"] else [self.accel.current_device()]
            self.batches = capture(probe, lambda b: self.loss_of(self._on_device(b)), self.batches, rng)
        if self.compile_mode != "eager":
            self.engine.compile()
        if clock is not None:
            clock.mark("engine_ready")  # the engine and this rank's data
        collector.resume()  # paused by the runner script while it started (runners/collector.py)

    def _attention(self, config: Any, probe: Probe | None) -> Any:
        """Install this run's attention (an SP mode, or plain SDPA probed for the sp-check); the SP mpu or None."""
        if probe is not None:
            probe.resolve(self.layers)
        if self.sp > 1:
            return sp_impl(self.args).register(self.args, config, self.heads, self.kv_heads, probe)
        if probe is not None:  # a no-SP run of the sp-check
            import sp_attention

            sp_attention.reference(probe)
        return None

    def _engine_config(self, ds_config: dict[str, Any]) -> dict[str, Any]:
        cfg = dict(ds_config)
        if self.compile_mode == "deepcompile":
            cfg = dsconfig.deep_merge(cfg, {"compile": {"deepcompile": True}})
        if self.sp > 1:
            cfg["sequence_parallel_size"] = self.sp
        else:
            cfg.pop("sequence_parallel_size", None)
        return cfg

    def _initialize(self, model: Any, cfg: dict[str, Any], mpu: Any) -> None:
        import deepspeed
        import torch

        init: dict[str, Any] = {"model": model, "config": cfg}
        if self.args.torch_adam or "optimizer" not in cfg:
            init["optimizer"] = torch.optim.AdamW(model.parameters(), lr=self.args.lr, weight_decay=0.0)
        else:
            init["model_parameters"] = [p for p in model.parameters() if p.requires_grad]
        if mpu is not None:
            init["mpu"] = mpu
        self.engine, *_ = deepspeed.initialize(**init)
        # Under the SP mpu DeepSpeed (checked up to 0.19.8) stores None as the engine's
        # data_parallel_group, and DeepCompile's 'dc' op dereferences it (SIGSEGV in
        # _initialize_deepcompile_native). The group ZeRO reduces over is the
        # sequence-data-parallel one: DeepCompile gets that (the sp-check judges the result).
        dc_sp = self.sp > 1 and self.compile_mode == "deepcompile"
        if dc_sp and getattr(self.engine, "data_parallel_group", None) is None:
            self.engine.data_parallel_group = self.engine.seq_data_parallel_group

    def _data(self) -> Any:
        """This rank's batch iterator. Every rank draws its own shard of the packed blocks."""
        a = self.args
        # Enough blocks for the run (synthetic data is generated to size; text wraps into epochs).
        needed = a.steps * self.grad_accum * self.micro_batch * self.world
        tokens, self.data_source = corpus.load_tokens(
            a.dataset,
            dataset_config=a.dataset_config,
            percent=a.dataset_percent,
            model_name=a.model,
            vocab=self.vocab,
            seq_length=a.seq_length,
            samples_needed=needed,
            seed=a.seed,
        )
        if tokens.numel() and int(tokens.max()) >= self.vocab:  # none at all: pack() says so
            raise RunnerError(
                f"the data has token ids up to {int(tokens.max())}, beyond the vocabulary ({self.vocab})"
            )
        blocks = corpus.pack(tokens, a.seq_length)
        self.shard = corpus.ShardedBatches(blocks, self.micro_batch, self.world, self.rank, a.seed)
        if self.reference:
            import ulysses

            return ulysses.reference_batches(self.shard, a.sequence_parallel, self.rank, self.world)
        if self.sp > 1:
            return sp_impl(a).data(self.shard, self.accel, a)
        return iter(self.shard)

    def loss_of(self, batch: dict[str, Any]) -> Any:
        if self.sp > 1:  # ring attention shares Ulysses' full-sequence loss
            import ulysses

            return ulysses.loss(self.engine, batch)
        return self.engine(**batch).loss

    def _on_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {
            k: v.to(self.device, non_blocking=True)
            for k, v in batch.items()
            if not (self.seq2seq and k == "position_ids")  # T5 has relative positions
        }

    def step(self) -> tuple[float, Any]:
        """One optimizer step: (wall time after a device synchronize, summed micro-step loss tensor)."""
        import torch

        t0 = time.perf_counter()
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for _ in range(self.grad_accum):
            loss = self.loss_of(self._on_device(next(self.batches)))
            self.engine.backward(loss)
            self.engine.step()
            total += loss.detach().float()  # stays on the device: no sync here
        self.accel.synchronize()
        return time.perf_counter() - t0, total

    def global_loss(self, total: Any, stop: bool = False) -> tuple[float, bool]:
        """Mean over the micro steps and over the data-parallel ranks, so every ZeRO stage logs the same number;
        and whether any rank was asked to stop (rank 0's stop request rides the same all-reduce).

        Gloo has no AVG reduction, hence SUM / world. Ranks of one
        sequence-parallel group already hold the same (gathered) loss, so the
        mean over all ranks equals the mean over the data-parallel groups.
        """
        import deepspeed
        import torch

        t = torch.stack([total / self.grad_accum, torch.full_like(total, float(stop))])
        deepspeed.comm.all_reduce(t, op=deepspeed.comm.ReduceOp.SUM)
        loss, stops = t.tolist()
        return loss / self.world, stops > 0

    def tflops_per_gpu(self, iter_time: float) -> float:
        """Model TFLOP/s per rank (GPU) for one optimizer step of ``iter_time`` seconds."""
        return self.flops_per_token * self.tokens_per_step / iter_time / self.world / 1e12

    def memory(self) -> tuple[int, int]:
        return common.memory(self.accel, self.dev["on_cpu"])

    def lr(self) -> float | None:
        try:
            return float(self.engine.get_lr()[0])
        except (AttributeError, IndexError, TypeError):
            return None

    def epoch(self) -> int:
        return self.shard.epoch + 1  # 1-based, as in the seed's "Epoch 1, Step ..." line
