"""Memory forecast: DeepSpeed's estimators, the analytic count by hand, the fit on MLflow history.

The CLI side (`dstui list`, `dstui run --dry-run`, skip_predicted_oom) is in e2e/test_forecast_cli.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from helpers import IMPORTS_DEEPSPEED

from dstui.analysis import forecast as fc
from dstui.analysis.forecast_model import (
    GIB,
    MODELS_DIR,
    ModelShape,
    analytic_activations,
    framework_overhead,
    model_shape,
    model_states,
)
from dstui.spec.settings import Settings

pytestmark = IMPORTS_DEEPSPEED


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2", "llama-1b"])
def test_parameter_counts_match_the_built_model(preset: str) -> None:
    """Counted from the preset's config alone, equal to the model transformers builds (on meta)."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(**json.loads((MODELS_DIR / f"{preset}.json").read_text()))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    shape = model_shape(preset)
    assert shape is not None
    assert shape.params == sum(p.numel() for p in model.parameters())
    # DeepSpeed's model_to_params: the largest module's own (non-recursive) parameters
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert shape.largest_layer_params == largest


def _printed_table(fn, *args) -> dict[str, float]:
    """Parse DeepSpeed's ``*_all_cold`` table: options -> per-GPU value (bytes/2**30, 2 decimals)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    rows = {}
    for line in out.getvalue().splitlines():
        m = re.match(r"\s*[\d.]+GB \|\s*([\d.]+)GB \| (.*)$", line)
        if m:
            rows[m.group(2).strip()] = float(m.group(1))
    return rows


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_model_states_are_deepspeeds_cold_estimates(gpus: int) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

    shape = model_shape("llama-1b")
    z2 = _printed_table(estimate_zero2_model_states_mem_needs_all_cold, shape.params, gpus)
    z3 = _printed_table(
        estimate_zero3_model_states_mem_needs_all_cold, shape.params, shape.largest_layer_params, gpus
    )
    assert z2 and z3

    def ours(stage: int, offload: str = "none", offload_params: str = "none") -> float:
        b = model_states(shape, zero_stage=stage, offload=offload, offload_params=offload_params,
                         dtype="bf16", gpus=gpus, nodes=1)  # fmt: skip
        return round(b / GIB, 2)

    assert ours(2) == z2["offload_optimizer=none"]
    assert ours(1) == z2["offload_optimizer=none"]
    assert ours(2, "cpu") == z2["offload_optimizer=OffloadDeviceEnum.cpu"]
    assert ours(3) == z3["offload_param=none, offload_optimizer=none, zero_init=1"]
    assert ours(3, "cpu") == z3["offload_param=none, offload_optimizer=OffloadDeviceEnum.cpu, zero_init=1"]
    cpu = "OffloadDeviceEnum.cpu"
    assert ours(3, "cpu", "cpu") == z3[f"offload_param={cpu}, offload_optimizer={cpu}, zero_init=1"]
    # ZeRO-0 has no estimator: 16-bit weights + gradients, fp32 master, two Adam moments, unpartitioned
    assert model_states(shape, zero_stage=0, offload="none", offload_params="none", dtype="bf16",
                        gpus=gpus, nodes=1) == (2 + 2 + 4 + 8) * shape.params  # fmt: skip
    # fp32 without ZeRO is plain PyTorch: weights, gradients, two Adam moments
    assert model_states(shape, zero_stage=0, offload="none", offload_params="none", dtype="fp32",
                        gpus=gpus, nodes=1) == 16 * shape.params  # fmt: skip


TINY = ModelShape(family="llama", vocab=10, hidden=4, intermediate=8, layers=2, heads=2, kv_heads=2,
                  positions=16, tied=False)  # fmt: skip


def test_analytic_activations_by_hand() -> None:
    # seq 3 x micro batch 2 = 6 tokens, bf16 (e = 2), h = 4, kv = 4, i = 8, V = 10, 2 layers:
    # per layer 6 * (2 * (6*4 + 2*4 + 4*8) + 8*4) = 6 * 160 = 960; logits 6 * 10 * (2 + 8) = 600
    assert analytic_activations(TINY, seq_length=3, micro_batch=2, dtype="bf16", checkpointing=False) == 2 * 960 + 600
    # checkpointing: each layer's input (6 * 2 * 4 per layer) plus one layer recomputed
    assert analytic_activations(TINY, seq_length=3, micro_batch=2, dtype="bf16", checkpointing=True) == 96 + 960 + 600
    # fp32: e = 4 -> per layer 6 * (4 * 64 + 32) = 1728; logits 6 * 10 * 12 = 720
    assert analytic_activations(TINY, seq_length=3, micro_batch=2, dtype="fp32", checkpointing=False) == 2 * 1728 + 720


def test_overhead_reads_the_buckets_of_the_ds_config() -> None:
    shape = model_shape("llama-1b")
    small = {"zero_optimization": {"reduce_bucket_size": 1000, "stage3_max_live_parameters": 10,
                                   "stage3_prefetch_bucket_size": 5}}  # fmt: skip
    base = framework_overhead(shape, zero_stage=0, dtype="bf16", ds_config=None, ranks=2)
    assert framework_overhead(shape, zero_stage=2, dtype="bf16", ds_config=small, ranks=2) == base + 2000
    # a gathered ZeRO-3 parameter costs what the rank does not hold already: half of it on 2 ranks
    assert framework_overhead(shape, zero_stage=3, dtype="bf16", ds_config=small, ranks=2) == base + 2000 + 15
    assert framework_overhead(shape, zero_stage=3, dtype="bf16", ds_config=small, ranks=1) == base + 2000
    # DeepSpeed's defaults: 5e8-element buckets, 1e9 live parameters, 5e7 prefetch
    assert framework_overhead(shape, zero_stage=2, dtype="bf16", ds_config={}, ranks=2) == base + 10**9


def test_forecast_parts_and_unknown_models() -> None:
    s = Settings(model="llama-1b", zero_stage=3, gpus=2, dtype="bf16", seq_length=2048, micro_batch=4)
    f = fc.forecast(s)
    shape = model_shape("llama-1b")
    assert f.source == "analytic"
    assert f.model_states == model_states(shape, zero_stage=3, offload="none", offload_params="none",
                                          dtype="bf16", gpus=2, nodes=1)  # fmt: skip
    # the larger of two moments: forward (no gradients yet, every activation) and the step
    assert f.forward_free == 2 * shape.params // 2  # ZeRO-3's 16-bit gradient partition
    assert f.total == max(f.model_states - f.forward_free + f.activations, f.model_states + f.step_extra) + f.overhead
    assert f.total == f.forward_peak  # micro batch 4 x 2048: activations decide


def test_small_batches_peak_at_the_optimizer_step() -> None:
    # ZeRO-0 bf16 on 1 GPU, micro batch 1: 24 bytes per parameter at the step (H200 measured 24.65 GiB)
    shape = model_shape("llama-1b")
    f = fc.forecast(Settings(model="llama-1b", zero_stage=0, gpus=1, dtype="bf16", seq_length=2048, micro_batch=1))
    assert f.step_extra == 8 * shape.params
    assert f.total == f.step_peak == 24 * shape.params + f.overhead
    # offloaded optimizer: no gradients on the GPU, forward decides
    g = fc.forecast(Settings(model="llama-1b", zero_stage=1, offload="cpu", gpus=1, dtype="bf16", micro_batch=1))
    assert g.forward_free == 0 and g.total == g.forward_peak
    assert f.label().endswith(" GiB")
    assert fc.forecast(Settings(model="someone/hub-model")) is None
    assert fc.forecast(Settings(kind="command", command=["true"])) is None


def test_oom_reason_and_levels() -> None:
    f = fc.Forecast(model_states=30 * GIB, activations=5 * GIB, overhead=GIB, source="analytic")
    assert fc.oom_reason(f, 24 * GIB) == "skipped: predicted OOM (36.0 GiB > 24.0 GiB)"
    assert fc.oom_reason(f, 80 * GIB) is None
    assert fc.oom_reason(f, None) is None
    assert [fc.level(f, c) for c in (24 * GIB, 38 * GIB, 80 * GIB, None)] == ["oom", "tight", "ok", "unknown"]
    assert fc.column(f, 24 * GIB) == "36.0 GiB OOM"
    assert fc.column(None) == "-"


# -- the fit on MLflow history -------------------------------------------------

COEF = (3.0 * GIB, 900.0, 0.05)  # c0 (bytes), c1 (per s*b*e), c2 (per s^2*b*e)
POINTS = [(256, 1, "bf16"), (512, 2, "bf16"), (1024, 1, "fp32"), (2048, 4, "bf16"), (512, 8, "fp32")]


def _truth(seq: int, mb: int, dtype: str) -> float:
    return sum(c * f for c, f in zip(COEF, fc.features(seq, mb, dtype), strict=True))


def _log_synthetic_runs(client, exp_id: str, points, *, stage: int = 2, device: str = "cuda") -> None:
    """GPU runs as the supervisor logs them: params from settings, summary.mem_peak_max."""
    for i, (seq, mb, dtype) in enumerate(points):
        s = Settings(model="llama-125m", zero_stage=stage, gpus=2, seq_length=seq, micro_batch=mb, dtype=dtype)
        base = fc._parts(model_shape("llama-125m"), s, {}).forward_peak  # states held through forward + overhead
        run = client.create_run(exp_id, run_name=f"p{i}", tags={
            "dstui.role": "run", "dstui.device": device, "dstui.status": "done", "dstui.condition": f"c{i}"})  # fmt: skip
        for k, v in s.model_dump(mode="json").items():
            if not isinstance(v, (dict, list)):
                client.log_param(run.info.run_id, k, "" if v is None else str(v))
        client.log_metric(run.info.run_id, "summary.mem_peak_max", base + _truth(seq, mb, dtype))
        client.set_terminated(run.info.run_id)


def test_history_fit_recovers_known_coefficients(home) -> None:
    from dstui.tracking import client as tracking

    c = tracking.client()
    exp = c.create_experiment("history")
    _log_synthetic_runs(c, exp, POINTS)
    _log_synthetic_runs(c, exp, POINTS[:2], device="cpu")  # RSS on CPU: must be ignored
    fit = fc.history_fit(c, ["llama-125m"])
    assert len(fit.observations) == len(POINTS)
    coef, n = fit.coefficients("llama-125m", False)
    assert n == len(POINTS)
    assert coef == pytest.approx(COEF, rel=1e-6)
    # a new point is forecast from the fit, not analytically
    s = Settings(model="llama-125m", zero_stage=2, gpus=2, seq_length=4096, micro_batch=2, dtype="bf16")
    got = fc.forecast_runs([type("R", (), {"name": "x", "settings": s})()], {"x": {}})["x"]
    assert got.source == f"fit on {len(POINTS)} runs"
    assert got.activations == pytest.approx(_truth(4096, 2, "bf16"), rel=1e-6)
    # checkpointing has no history: analytic
    s2 = s.model_copy(update={"activation_checkpointing": True})
    assert fc.forecast(s2, ds_config={}, fit=fit).source == "analytic"


def test_the_store_is_opened_only_for_runs_a_fit_can_serve(home, monkeypatch) -> None:
    """A batch of the user's own commands (or of unknown models) never opens MLflow (~2 CPU-s)."""
    opened: list[str] = []
    real = fc.stored_fit
    monkeypatch.setattr(fc, "stored_fit", lambda uri, models: opened.append(str(uri)) or real(uri, models))

    def run(name: str, **settings) -> object:
        return type("R", (), {"name": name, "settings": Settings(**settings)})()

    cmd = run("cmd", kind="command", command=["true"])
    unknown = run("hub", model="someone/not-a-preset")
    assert fc.forecast_runs([cmd, unknown]) == {"cmd": None, "hub": None}
    assert opened == []
    got = fc.forecast_runs([cmd, run("llama", model="llama-125m", gpus=2, seq_length=512)])
    assert len(opened) == 1 and got["llama"] is not None and got["llama"].source == "analytic"


def test_the_sqlite_store_is_read_directly_and_gives_mlflows_fit(home) -> None:
    """The local store answers without mlflow (issue 31: ~4 s of `dstui run`), with exactly MLflow's runs."""
    import subprocess
    import sys

    from dstui.analysis import forecast_history
    from dstui.core import paths
    from dstui.tracking import client as tracking

    c = tracking.client()
    exp = c.create_experiment("history")
    _log_synthetic_runs(c, exp, POINTS)
    _log_synthetic_runs(c, exp, POINTS[:2], device="cpu")  # RSS on CPU: not searched
    _log_synthetic_runs(c, exp, POINTS[2:4], stage=3)  # another ZeRO set-up: its own group
    gone = c.create_experiment("deleted")  # neither a deleted experiment's runs nor a deleted run count
    _log_synthetic_runs(c, gone, [(128, 1, "bf16")])
    c.delete_experiment(gone)
    _log_synthetic_runs(c, exp, [(4096, 8, "fp32")])
    newest = c.search_runs([exp], order_by=["attributes.start_time DESC"], max_results=1)[0]
    c.delete_run(newest.info.run_id)
    c.set_tag(c.search_runs([exp], filter_string="tags.`dstui.device` = 'cuda'")[0].info.run_id, "dstui.status", "failed")

    uri = paths.tracking_uri()
    runs = forecast_history.read_runs(forecast_history.sqlite_file(uri), ["llama-125m", "gpt2-small"])
    assert runs is not None and len(runs) == len(POINTS) + 2  # the failed one is read; the fit skips it
    direct = fc.fit_of(runs)
    searched = fc.history_fit(c, ["llama-125m", "gpt2-small"])
    assert len(searched.observations) == len(POINTS) + 1
    assert sorted(direct.observations) == sorted(searched.observations)
    assert sorted(fc.stored_fit(uri, ["llama-125m"]).observations) == sorted(searched.observations)
    # and without importing mlflow at all
    code = ("import sys; from dstui.analysis import forecast as fc; "
            f"fit = fc.stored_fit({uri!r}, ['llama-125m']); print(len(fit.observations), 'mlflow' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [str(len(POINTS) + 1), "False"]


def test_a_store_of_another_shape_is_left_to_mlflow(tmp_path) -> None:
    import sqlite3

    from dstui.analysis import forecast_history

    db = tmp_path / "other.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE runs (run_uuid TEXT)")
    assert forecast_history.read_runs(db, ["llama-125m"]) is None
    assert forecast_history.read_runs(tmp_path / "missing.db", ["llama-125m"]) is None
    assert forecast_history.sqlite_file("http://mlflow:5000") is None
    assert forecast_history.sqlite_file("sqlite:////x/mlflow.db?timeout=3") == Path("/x/mlflow.db")


def test_too_little_history_falls_back_to_analytic() -> None:
    fit = fc.ActivationFit()
    s = Settings(model="llama-125m", gpus=2, seq_length=512)
    for seq in (128, 256, 512):  # three points for three coefficients: not enough to trust
        fc.observe(fit, s.model_copy(update={"seq_length": seq}), 5 * GIB, {})
    assert fc.forecast(s, fit=fit).source == "analytic"
    # a fixed sequence length leaves two free coefficients: three micro batches are enough
    fit = fc.ActivationFit()
    for mb in (1, 4, 8):
        fc.observe(fit, s.model_copy(update={"micro_batch": mb}), mb * GIB + 10 * GIB, {})
    assert fc.forecast(s, fit=fit).source == "fit on 3 runs"
    fit = fc.ActivationFit()
    for mb in (1, 4):
        fc.observe(fit, s.model_copy(update={"micro_batch": mb}), mb * GIB + 10 * GIB, {})
    assert fc.forecast(s, fit=fit).source == "analytic"


def test_forecast_vs_measured_frame(home) -> None:
    from dstui.analysis.fetch import fetch_runs
    from dstui.analysis.forecast_check import forecast_vs_measured
    from dstui.tracking import client as tracking

    c = tracking.client()
    exp = c.create_experiment("measured")
    _log_synthetic_runs(c, exp, POINTS[:2])
    _, runs = fetch_runs(c, "measured")
    frame = forecast_vs_measured(runs)
    assert list(frame["condition"]) == ["c0", "c1"]
    shape = model_shape("llama-125m")
    for (_, row), (seq, mb, dtype) in zip(frame.iterrows(), POINTS[:2], strict=True):
        s = Settings(model="llama-125m", zero_stage=2, gpus=2, seq_length=seq, micro_batch=mb, dtype=dtype)
        measured = (fc._parts(shape, s, {}).forward_peak + _truth(seq, mb, dtype)) / GIB
        predicted = fc.forecast(s, ds_config={}).gib  # analytic: the report judges the estimate, not a fit on itself
        assert row["measured_gib"] == pytest.approx(measured)
        assert row["forecast_gib"] == pytest.approx(predicted)
        assert row["error_pct"] == pytest.approx(100 * (predicted - measured) / measured)
        assert row["runs"] == 1


def test_compose_cells_are_coloured_against_the_gpu() -> None:
    from dstui.spec.expand import expand
    from dstui.spec.experiment import ExperimentSpec
    from dstui.tui.forecast_cells import forecast_cells

    spec = ExperimentSpec(name="c", settings={"model": "llama-1b", "seq_length": 2048, "micro_batch": 4,
                                              "dtype": "bf16", "gpus": 2}, axes={"zero_stage": [0, 3]})  # fmt: skip
    runs = expand(spec)
    cells = forecast_cells(runs, None, detected=None, declared_gib=30)
    assert cells["z0-r0"].style == "bold red" and str(cells["z0-r0"]).endswith("GiB OOM")
    assert cells["z3-r0"].style == "bold yellow"  # 27.6 of 30 GiB (H200 measured 28.75)
    assert forecast_cells(runs, None, detected=80 * GIB)["z3-r0"].style == "green"


def test_a_setup_with_few_runs_shifts_the_pooled_fit_by_its_residual() -> None:
    z2 = Settings(model="m", zero_stage=2)
    z3 = Settings(model="m", zero_stage=3)
    fit = fc.ActivationFit()
    for seq, mb, dtype in POINTS:  # ZeRO-2 runs: enough for a line of their own
        fit.add("m", False, fc.group_of(z2), seq, mb, dtype, _truth(seq, mb, dtype))
    # one ZeRO-3 run, 1 GiB above the line: the pooled line moves a little, the shift puts it back
    fit.add("m", False, fc.group_of(z3), 512, 2, "bf16", _truth(512, 2, "bf16") + GIB)
    target = z3.model_copy(update={"seq_length": 4096, "micro_batch": 1, "dtype": "bf16"})
    value, n = fit.predict(target)
    assert n == len(POINTS) + 1
    pooled, _ = fit.coefficients("m", False)
    line = sum(c * f for c, f in zip(pooled, fc.features(4096, 1, "bf16"), strict=True))
    residual = _truth(512, 2, "bf16") + GIB - sum(c * f for c, f in zip(pooled, fc.features(512, 2, "bf16"), strict=True))
    assert value == int(line + residual)
    assert value > _truth(4096, 1, "bf16") + 0.5 * GIB  # the ZeRO-3 offset survives
    # ZeRO-2 has its own fit: exact
    assert fit.predict(z2.model_copy(update={"seq_length": 4096, "micro_batch": 1, "dtype": "bf16"}))[0] == pytest.approx(
        _truth(4096, 1, "bf16"), rel=1e-6
    )
