"""The time model: first-principles terms, calibration on measured runs, and the honesty of its uncertainty.

The calibration is checked against a known truth: step times generated from
known factors on the terms (plus noise) must be recovered closely enough that
unmeasured configurations are predicted within the stated interval, and a
configuration whose costly term no observation exercised must come with a
wide interval, not a confident wrong number.
"""

from __future__ import annotations

import math
import random

import pytest

from dstui.analysis.forecast_model import model_shape
from dstui.analysis.time_fit import MODEL_FLOOR, Observation, TimeModel
from dstui.analysis.time_model import TERMS, cpu_hardware, gpu_hardware, terms
from dstui.spec.settings import Settings

SHAPE_1B = model_shape("llama-1b")
TINY = model_shape("tiny-llama")


def s(z: int, mb: int, ga: int, *, gpus: int = 2, model: str = "llama-1b", **kw: object) -> Settings:
    return Settings(model=model, zero_stage=z, micro_batch=mb, grad_accum=ga, gpus=gpus, seq_length=2048, dtype="bf16", **kw)


def test_terms_follow_deepspeeds_communication_per_stage() -> None:
    hw = gpu_hardware("NVIDIA H100 80GB HBM3")
    t = {z: terms(s(z, 4, 2), SHAPE_1B, hw) for z in range(4)}
    # ZeRO-0/1 reduce once per step, ZeRO-2 every micro step, ZeRO-3 gathers twice and reduces every micro step
    assert t[0]["comm"] == pytest.approx(t[1]["comm"])
    assert t[2]["comm"] == pytest.approx(t[1]["comm"] * 3 / 2)  # (ga + 1) vs 2 all-reduce volumes, ga = 2
    assert t[3]["comm"] == pytest.approx(t[1]["comm"] * 3)  # 3 * ga vs 2
    assert t[3]["zero3"] > 0 and all(t[z]["zero3"] == 0 for z in (0, 1, 2))
    assert t[0]["optimizer"] == pytest.approx(2 * t[1]["optimizer"])  # ZeRO-0 updates all of it, 1-3 a half each
    # the same tokens per step: the same compute whatever the split into micro batches
    assert terms(s(1, 1, 8), SHAPE_1B, hw)["compute"] == pytest.approx(t[1]["compute"])
    assert terms(s(1, 1, 8), SHAPE_1B, hw)["small_batch"] == pytest.approx(4 * t[1]["small_batch"])


def test_one_rank_communicates_nothing_and_offload_moves_work_to_the_host() -> None:
    hw = gpu_hardware("NVIDIA H100 80GB HBM3")
    one = terms(s(3, 4, 1, gpus=1), SHAPE_1B, hw)
    assert one["comm"] == 0 and one["collectives"] == 0
    off = terms(s(2, 4, 1, offload="cpu"), SHAPE_1B, hw)
    assert off["optimizer"] == 0 and off["cpu_adam"] > 0 and off["host_link"] > 0
    ckpt = terms(s(1, 4, 1, activation_checkpointing=True), SHAPE_1B, hw)
    assert ckpt["compute"] == pytest.approx(terms(s(1, 4, 1), SHAPE_1B, hw)["compute"] * 4 / 3)


def test_the_prior_prices_a_known_gpu_from_its_data_sheet() -> None:
    """llama-1b, 16k tokens per step on an H100 at the prior's 50% of 989 TFLOP/s: ~0.26 s of compute per rank."""
    t = terms(s(1, 4, 2, gpus=1), SHAPE_1B, gpu_hardware("NVIDIA H100 80GB HBM3"))
    flops = (6 * SHAPE_1B.params + 12 * SHAPE_1B.layers * SHAPE_1B.hidden * 2048) * 4 * 2 * 2048
    assert t["compute"] == pytest.approx(flops / (989e12 * 0.5))
    unknown = gpu_hardware("Some Future GPU")
    assert unknown.spread > gpu_hardware("NVIDIA H100 80GB HBM3").spread  # less is known: wider prior


def _truth(factors: dict[str, float]) -> tuple[TimeModel, list[tuple[Settings, dict[str, float], float]]]:
    """Configurations of a 2-rank CPU space and their 'measured' times from known factors, 2% noise."""
    hw = cpu_hardware("test")
    rng = random.Random(7)
    out = []
    for z in range(4):
        for mb, ga in ((1, 4), (2, 2), (4, 1)):
            cfg = s(z, mb, ga, model="tiny-llama")
            t = terms(cfg, TINY, hw)
            true = sum(factors.get(k, 1.0) * v for k, v in t.items())
            out.append((cfg, t, true * math.exp(rng.gauss(0, 0.02))))
    return TimeModel(hw), out


def test_calibration_recovers_a_known_machine_and_predicts_unmeasured_configs_within_its_interval() -> None:
    factors = {"launch": 0.3, "collectives": 20.0, "zero3": 8.0, "step": 0.5}
    model, data = _truth(factors)
    measured = data[::2]  # half of the space
    model.observations = [Observation(t, y, 0.02) for _, t, y in measured]
    model.fit()
    for _, t, y in data[1::2]:
        p = model.predict(t)
        lo, hi = p.interval(2.58)  # 99%
        assert lo <= y <= hi, (p, y)
        assert abs(math.log(p.seconds / y)) < 0.15
    # the factors that shaped the data were found where the data speaks about them
    f = model.factors()
    assert f["zero3"] == pytest.approx(8.0, rel=0.3)
    # ZeRO 0/1 make one or two calls a step, ZeRO-2/3 one per micro step: the calls' latency shares
    # its evidence with the fixed per-step cost, so it is found within a factor 2, not 30%
    assert 10.0 < f["collectives"] < 40.0


def test_a_term_no_run_exercised_keeps_the_prior_and_a_wide_interval() -> None:
    """Measured only ZeRO-0..2: ZeRO-3's per-module fetches are uncalibrated, so its prediction is unsure."""
    model, data = _truth({"zero3": 8.0})
    model.observations = [Observation(t, y, 0.02) for cfg, t, y in data if cfg.zero_stage < 3]
    model.fit()
    z3 = [model.predict(t) for cfg, t, _ in data if cfg.zero_stage == 3]
    z1 = [model.predict(t) for cfg, t, _ in data if cfg.zero_stage == 1]
    assert min(p.log_sd for p in z3) > 5 * max(p.log_sd for p in z1)
    assert model.factors()["zero3"] == pytest.approx(1.0, rel=0.05)  # no data: the prior's guess


def test_no_observation_is_the_prior_and_the_model_error_never_drops_below_its_floor() -> None:
    hw = cpu_hardware("test")
    t = terms(s(1, 4, 1, model="tiny-llama"), TINY, hw)
    prior = TimeModel(hw).fit().predict(t)
    assert prior.seconds == pytest.approx(sum(t.values()))
    assert prior.log_sd > 1  # a factor 30 either way
    one = TimeModel(hw, [Observation(t, 0.05, 0.001)]).fit()
    assert one.model_sd >= MODEL_FLOOR
    again = one.predict(t)
    assert again.seconds == pytest.approx(0.05, rel=0.02)
    assert again.log_sd >= MODEL_FLOOR
    assert set(one.factors()) == set(TERMS)
