"""One DeepSpeed engine plus the data it eats: model building, engine set-up, batches, one step."""

from __future__ import annotations

import argparse
import time
from typing import Any

import common
import corpus
import placement
from common import RunnerError
from phases import PhaseClock

from dstui.spec import dsconfig


class Trainer:
    """One DeepSpeed engine plus the data it eats and the numbers it produces."""

    def __init__(
        self,
        args: argparse.Namespace,
        ds_config: dict[str, Any],
        *,
        use_sp: bool,
        clock: PhaseClock | None = None,
    ) -> None:
        import deepspeed
        import torch
        from deepspeed.accelerator import get_accelerator

        self.args = args
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
        mpu = None
        if self.sp > 1:
            import ulysses

            mpu = ulysses.register(args, config, heads, kv_heads)
        cfg = dict(ds_config)
        if args.deepcompile or (self.sp > 1 and args.sp_mode == "deepcompile"):
            cfg = dsconfig.deep_merge(cfg, {"compile": {"deepcompile": True}})
        if self.sp > 1:
            cfg["sequence_parallel_size"] = self.sp
        else:
            cfg.pop("sequence_parallel_size", None)
        self.ds_config = cfg

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

        init: dict[str, Any] = {"model": model, "config": cfg}
        if args.torch_adam or "optimizer" not in cfg:
            init["optimizer"] = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        else:
            init["model_parameters"] = [p for p in model.parameters() if p.requires_grad]
        if mpu is not None:
            init["mpu"] = mpu
        self.engine, *_ = deepspeed.initialize(**init)
        # dstui refuses SP + DeepCompile (dstui/spec/ulysses_rules.py): DeepSpeed hands the
        # 'dc' op a None group under the Ulysses mpu and the op dereferences it. Started
        # by hand (GPU validation), give it the sequence-data-parallel group ZeRO uses,
        # and let --sp-check judge the result.
        dc_sp = self.sp > 1 and cfg.get("compile", {}).get("deepcompile")
        if dc_sp and getattr(self.engine, "data_parallel_group", None) is None:
            self.engine.data_parallel_group = self.engine.seq_data_parallel_group
        if (
            args.compile
            or args.deepcompile
            or (self.sp > 1 and args.sp_mode in ("compile", "deepcompile"))
        ):
            self.engine.compile()

        self.micro_batch = self.engine.train_micro_batch_size_per_gpu()
        self.grad_accum = self.engine.gradient_accumulation_steps()
        self.tokens_per_step = self.micro_batch * self.grad_accum * args.seq_length * self.dp
        self.flops_per_token = common.flops_per_token(
            self.params, self.layers, self.hidden, args.seq_length
        )
        self.peak = common.peak_tflops(self.dev["gpu_name"], args.dtype)
        self.device = self.accel.current_device_name()
        self.batches = self._data()
        if clock is not None:
            clock.mark("engine_ready")  # the engine and this rank's data

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
        if self.sp > 1:
            import ulysses

            return ulysses.data(self.shard, self.accel)
        return iter(self.shard)

    def loss_of(self, batch: dict[str, Any]) -> Any:
        if self.sp > 1:
            import ulysses

            return ulysses.loss(self.engine, batch)
        return self.engine(**batch).loss

    def step(self) -> tuple[float, Any]:
        """One optimizer step: (wall time after a device synchronize, summed micro-step loss tensor)."""
        import torch

        t0 = time.perf_counter()
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for _ in range(self.grad_accum):
            batch = {
                k: v.to(self.device, non_blocking=True)
                for k, v in next(self.batches).items()
                if not (self.seq2seq and k == "position_ids")  # T5 has relative positions
            }
            loss = self.loss_of(batch)
            self.engine.backward(loss)
            self.engine.step()
            total += loss.detach().float()  # stays on the device: no sync here
        self.accel.synchronize()
        return time.perf_counter() - t0, total

    def global_loss(self, total: Any) -> float:
        """Mean over the micro steps and over the data-parallel ranks, so every ZeRO stage logs the same number.

        Gloo has no AVG reduction, hence SUM / world. Ranks of one
        sequence-parallel group already hold the same (gathered) loss, so the
        mean over all ranks equals the mean over the data-parallel groups.
        """
        import deepspeed

        t = total / self.grad_accum
        deepspeed.comm.all_reduce(t, op=deepspeed.comm.ReduceOp.SUM)
        return float(t.item()) / self.world

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
