"""`dstui tune`'s pure parts: the spec's tune block, candidates, probe rules, the search's choices, its state.

The end-to-end proofs (real DeepSpeed probes, the grid's winner, a hang, a
kill) are tests/e2e/test_tune_e2e.py; these pin the rules those runs follow.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dstui.analysis.time_fit import Prediction
from dstui.core.errors import DstuiError, SpecError
from dstui.spec.loading import parse_spec
from dstui.tune import candidates as cands
from dstui.tune import probe_rules, search, state
from dstui.tune.probe_rules import StepTime

REPO = Path(__file__).resolve().parents[2]

BASE = {"model": "tiny-llama", "seq_length": 64, "gpus": 2, "dtype": "fp32"}


def spec(tune: dict, **settings: object) -> object:
    return parse_spec({"name": "t", "settings": {**BASE, **settings}, "tune": tune})


@pytest.mark.parametrize(("tune", "field", "words"), [
    ({"space": {"zero_stage": [0, 4]}}, "tune.space.zero_stage", "must be one of 0, 1, 2, 3 (got 4)"),
    ({"space": {"micro_batch": [2, 2]}}, "tune.space.micro_batch", "listed twice"),
    ({"space": {"micro_batch": []}}, "tune.space.micro_batch", "at least one value"),
    ({"space": {"offload": ["cpu"]}}, "tune.space.offload.0", "'none', 'optimizer', 'params'"),
    ({"global_batch": 8, "tokens_per_step": 512}, "tune", "not both"),
    ({"probe_steps": 4, "warmup_steps": 2, "min_steps": 3}, "tune", "at least warmup_steps + min_steps"),
    ({"budget": 10}, "tune.budget", "did you mean 'budget_s'"),
    ({"precision": 0}, "tune.precision", "greater than 0"),
])  # fmt: skip
def test_tune_block_errors_name_the_field(tune: dict, field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        spec(tune)
    assert e.value.field == field and words in e.value.message, str(e.value)


def test_candidates_keep_the_global_batch_and_say_why_each_combination_is_out() -> None:
    sp = spec({"global_batch": 8, "space": {"zero_stage": [0, 3], "offload": ["none", "optimizer", "params"],
                                            "micro_batch": [1, 3, 4], "activation_checkpointing": [False],
                                            "sequence_parallel": [1]}})  # fmt: skip
    out = {c.name: c for c in cands.build(sp, cuda=False, capacity=None)}
    assert out["z0-mb1-ga4"].open and out["z0-mb1-ga4"].settings.grad_accum == 4
    assert out["z3-offparams-mb4-ga1"].settings.offload_params == "cpu"
    assert out["z0-offoptimizer-mb1-ga4"].pruned == "optimizer offload needs ZeRO 1-3"
    assert out["z0-offparams-mb1-ga4"].pruned == "parameter offload needs ZeRO-3"
    assert "not a multiple of micro batch 3 x 2" in out["z3-mb3"].pruned
    for c in out.values():  # every candidate trains the same samples per step
        if c.open:
            assert c.settings.micro_batch * c.settings.grad_accum * 2 == 8


def test_deepcompile_and_sequence_parallel_where_they_fit() -> None:
    sp = spec({"space": {"zero_stage": [1], "offload": ["none"], "micro_batch": [2], "activation_checkpointing": [False],
                         "deepcompile": [False, True]}}, micro_batch=2)  # fmt: skip
    out = {c.name: c for c in cands.build(sp, cuda=False, capacity=None)}
    assert out["z1-mb2-ga1-dc"].pruned.startswith("DeepCompile needs a CUDA GPU")
    assert "z1-mb2-ga2-sp2" in out  # tiny-llama: 4 heads, 64 tokens, 2 ranks: Ulysses 2 fits, its own accumulation
    assert out["z1-mb2-ga2-dc-sp2"].pruned.startswith("DeepCompile needs a CUDA GPU")
    auto = cands.build(spec({"space": {"zero_stage": [1], "offload": ["none"], "micro_batch": [2],
                                       "activation_checkpointing": [False]}}), cuda=True, capacity=None)  # fmt: skip
    assert {c.choice["deepcompile"] for c in auto} == {False, True}  # unset: both where CUDA is


def test_the_memory_forecast_leaves_out_what_cannot_fit_with_the_numbers() -> None:
    sp = spec({"global_batch": 16, "space": {"zero_stage": [0, 3], "offload": ["none"], "micro_batch": [1, 8],
                                             "activation_checkpointing": [False], "sequence_parallel": [1]}},
              model="llama-1b", seq_length=2048, dtype="bf16")  # fmt: skip
    out = {c.name: c for c in cands.build(sp, cuda=True, capacity=40 * 2**30)}
    assert out["z0-mb8-ga1"].pruned.startswith("predicted OOM (") and "> 40.0 GiB" in out["z0-mb8-ga1"].pruned
    assert out["z3-mb1-ga8"].open and out["z3-mb1-ga8"].memory < 40 * 2**30


def test_no_tune_block_is_a_one_line_error() -> None:
    with pytest.raises(SpecError) as e:
        cands.build(parse_spec({"name": "t", "settings": BASE}), cuda=False, capacity=None)
    assert e.value.field == "tune"


def test_a_probe_stops_when_tight_or_clearly_slower_and_stalls_are_not_its_pace() -> None:
    steady = [9.0, 5.0, 1.00, 1.01, 0.99, 1.00, 1.02]
    assert probe_rules.verdict(steady, warmup=2, min_steps=3, precision=0.03, best=None) == probe_rules.PRECISE
    noisy = [9.0, 5.0, 1.0, 1.3, 0.8, 1.2]
    assert probe_rules.verdict(noisy, warmup=2, min_steps=3, precision=0.03, best=None) is None
    best = StepTime(0.5, 0.01, 10)
    assert probe_rules.verdict(noisy, warmup=2, min_steps=3, precision=0.03, best=best) == probe_rules.SLOWER
    assert probe_rules.verdict(steady[:4], warmup=2, min_steps=3, precision=0.5, best=None) is None  # 2 timed steps
    st = probe_rules.step_time([9.0, 1.0, 1.0, 1.1, 0.9, 30.0], warmup=1)
    assert st.outliers == 1 and st.mean == pytest.approx(1.0)  # a 30 s stall is the machine's, not the config's
    assert probe_rules.step_time([1.0], warmup=0).half == math.inf


def _cand(name: str, order: int, **choice: object) -> cands.Candidate:
    base = {"zero_stage": 1, "offload_kind": "none", "micro_batch": 4, "activation_checkpointing": False,
            "deepcompile": False, "sequence_parallel": 1}  # fmt: skip
    return cands.Candidate(name, {**base, **choice}, order=order)


def test_the_search_probes_the_fastest_that_can_still_win_and_stops_with_its_reason() -> None:
    cs = [_cand("a", 0), _cand("b", 1), _cand("c", 2)]
    preds = {"a": Prediction(1.0, 0.5, "prior"), "b": Prediction(0.9, 0.02, "fit"), "c": Prediction(3.0, 0.02, "fit")}
    first = search.decide(cs, preds, None, confidence=0.9, margin=0.02)
    assert first.candidate == "b"  # nothing measured: the fastest prediction
    best = search.Best("b", StepTime(0.9, 0.005, 20))
    nxt = search.decide(cs, {k: v for k, v in preds.items() if k != "b"}, best, confidence=0.9, margin=0.02)
    assert nxt.candidate == "a"  # unsure enough that it may beat 0.9; c (3.0 +- 2%) cannot
    done = search.decide(cs, {"c": preds["c"]}, best, confidence=0.9, margin=0.02)
    assert done.candidate is None and "no remaining candidate can beat b" in done.why and "1 left unprobed" in done.why


def test_the_margin_is_the_bests_own_noise_when_that_is_larger() -> None:
    noisy_best = search.Best("b", StepTime(1.0, 0.10, 5))
    close = Prediction(0.95, 0.01, "fit")  # 5% faster on paper, inside the best's 10% noise
    assert not search.can_win(close, noisy_best, z=search.z_of(0.9), margin=0.02)
    assert search.can_win(close, search.Best("b", StepTime(1.0, 0.001, 50)), z=search.z_of(0.9), margin=0.02)


def test_an_oom_probe_leaves_out_what_needs_at_least_its_memory() -> None:
    oomed = _cand("z1-mb4", 0)
    oomed.memory = 30 * 2**30
    bigger, ckpt, offl, other = _cand("z1-mb8", 1, micro_batch=8), _cand("z1-mb8-ac", 2, micro_batch=8, activation_checkpointing=True), \
        _cand("z1-off-mb4", 3, offload_kind="optimizer"), _cand("z3-mb4", 4, zero_stage=3)  # fmt: skip
    other.memory = 38 * 2**30  # fits the 40 GiB GPU on paper; the OOM says forecasts run 40/30 short
    ckpt.memory = offl.memory = 10 * 2**30
    out = search.teach_oom([oomed, bigger, ckpt, offl, other], oomed, 40 * 2**30)
    assert bigger.pruned and "z1-mb4, which ran out of memory" in bigger.pruned
    assert ckpt.open and offl.open  # checkpointing and offload relieve memory: not dominated
    assert other.pruned and "x 1.33 > 40.0 GiB" in other.pruned
    assert out == ["z1-mb8", "z3-mb4"]


def test_state_round_trips_and_one_search_runs_at_a_time(tmp_path: Path) -> None:
    st = state.TuneState("spec.yaml", "t", "k", batch="b-1")
    st.probes.append(state.Probe("z1-mb4-ga1", "z1-mb4-ga1-r0", 0.05, 0.1, started=10.0, ended=40.0,
                                 step_time=0.04, half=0.002, steps=10))  # fmt: skip
    state.save(tmp_path, st)
    back = state.load(tmp_path)
    assert back == st and back.probes[0].usable and back.probes[0].wall_s == 30.0
    (tmp_path / state.STATE_FILE).write_text("{not json")
    assert state.load(tmp_path) is None  # unreadable: a fresh search, not a traceback
    with state.SearchLock(tmp_path), pytest.raises(DstuiError, match="already running"), state.SearchLock(tmp_path):
        pass
    with state.SearchLock(tmp_path):  # released by the first holder
        pass


def test_the_same_spec_finds_the_same_search_and_another_space_another() -> None:
    a = spec({"space": {"zero_stage": [1, 2]}})
    assert state.search_key(a) == state.search_key(spec({"space": {"zero_stage": [1, 2]}}))
    assert state.search_key(a) != state.search_key(spec({"space": {"zero_stage": [1, 3]}}))


def test_measured_gpu_peaks_refit_the_forecast_and_leave_out_what_no_longer_fits() -> None:
    """Probes that used 1.6x the forecast activations: the fit on them pushes micro batch 8 past a 60-GiB GPU."""
    from dstui.analysis import forecast

    sp = spec({"global_batch": 8, "space": {"zero_stage": [1], "offload": ["none"], "micro_batch": [1, 2, 4, 8],
                                            "activation_checkpointing": [False], "deepcompile": [False],
                                            "sequence_parallel": [1]}},
              model="llama-1b", seq_length=2048, dtype="bf16", gpus=1)  # fmt: skip
    out = {c.name: c for c in cands.build(sp, cuda=True, capacity=60 * 2**30)}
    assert all(c.open for c in out.values()) and out["z1-mb8-ga1"].memory < 60 * 2**30  # analytic: 49.6 GiB
    fit = forecast.ActivationFit()
    for name in ("z1-mb1-ga8", "z1-mb2-ga4", "z1-mb4-ga2"):
        fc = forecast.forecast(out[name].settings)
        assert forecast.observe(fit, out[name].settings, fc.total + 0.6 * fc.activations)
    assert cands.refit(out["z1-mb8-ga1"], 60 * 2**30, fit)
    assert out["z1-mb8-ga1"].pruned.startswith("predicted OOM (") and "fit on 3 runs" in out["z1-mb8-ga1"].memory_source
    assert not cands.refit(out["z1-mb1-ga8"], 60 * 2**30, fit) and out["z1-mb1-ga8"].open


def test_a_measured_probe_bounds_what_does_more_work() -> None:
    """One H100, llama-1b: after z2-mb4 measured 404 ms, the prior's [304, 917] ms for z3-mb4 spent a probe."""
    z1, z2, z3 = _cand("z1-mb4", 0), _cand("z2-mb4", 1, zero_stage=2), _cand("z3-mb4", 2, zero_stage=3)
    z3_mb2, z2_ac = _cand("z3-mb2", 3, zero_stage=3, micro_batch=2), _cand("z2-mb4-ac", 4, zero_stage=2,
                                                                          activation_checkpointing=True)
    assert search.does_more_work(z2, z3) and search.does_more_work(z1, z3) and search.does_more_work(z2, z2_ac)
    assert not search.does_more_work(z3, z2) and not search.does_more_work(z1, z2)  # ZeRO 1 and 2: no order
    assert not search.does_more_work(z3_mb2, z3) and not search.does_more_work(z2, z2)  # a larger batch; itself
    cs = [z1, z2, z3]
    measured = {"z1-mb4": StepTime(0.4031, 0.0018, 20), "z2-mb4": StepTime(0.4043, 0.0149, 12)}
    best = search.Best("z1-mb4", measured["z1-mb4"])
    wide = {"z3-mb4": Prediction(0.528, 0.31, "prior")}  # its optimistic end is far below 403 ms
    assert search.decide(cs, wide, best, confidence=0.9, margin=0.03).candidate == "z3-mb4"  # the prediction alone
    done = search.decide(cs, wide, best, confidence=0.9, margin=0.03, measured=measured)
    assert done.candidate is None
    # the highest low end of the probes it out-works: z1's 401.3 ms (z2's noisier interval reaches 389.4)
    assert "doing more work than a measured probe: z3-mb4 (>= z1-mb4)" in done.why, done.why
    assert search.floor_of(z3, cs, measured) == (pytest.approx(0.4031 - 0.0018), "z1-mb4")
    # a floor below the best's margin leaves the candidate in: a bound, not a verdict
    fast_z2 = {"z2-mb4": StepTime(0.30, 0.01, 12)}
    assert search.decide(cs, wide, best, confidence=0.9, margin=0.03, measured=fast_z2).candidate == "z3-mb4"


def test_a_smaller_micro_batch_is_more_work_only_while_the_larger_one_fits_with_room() -> None:
    """Same global batch: mb2 runs twice mb4's micro steps; near the GPU's limit the allocator can flip that."""
    gib = 2**30
    z1_mb4, z3_mb2 = _cand("z1-mb4", 0), _cand("z3-mb2", 1, zero_stage=3, micro_batch=2)
    z1_mb4.memory = 60 * gib
    assert search.does_more_work(z1_mb4, z3_mb2)  # no capacity (CPU): the order holds
    assert search.does_more_work(z1_mb4, z3_mb2, 80 * gib)  # 60 of 80 GiB: room
    assert not search.does_more_work(z1_mb4, z3_mb2, 64 * gib)  # 60 of 64 GiB: past the 90% headroom
    z1_mb4.memory = None
    assert not search.does_more_work(z1_mb4, z3_mb2, 80 * gib)  # no forecast: no claim
    assert not search.does_more_work(z3_mb2, _cand("z3-mb4", 2, zero_stage=3))  # a larger batch is not more work


GRIDS = [  # (measured grid, spec, GPU, GiB, probes the search spends on it): docs/gpu-validation, section 10
    ("gpu-2xh100-2026-11-28-tune", "tune1.yaml", "NVIDIA H100 80GB HBM3", 80, 3),
    ("gpu-2xh200-2026-11-28-tune1", "tune1.yaml", "NVIDIA H200", 140, 2),
    ("gpu-2xh200-2026-11-28-tune2", "tune2.yaml", "NVIDIA H200", 140, 2),
]


@pytest.mark.parametrize(("folder", "spec_file", "gpu", "gib", "probes"), GRIDS, ids=[g[0] for g in GRIDS])
def test_replayed_on_a_measured_gpu_grid_the_search_spends_at_most_a_third_of_it(
    folder: str, spec_file: str, gpu: str, gib: int, probes: int
) -> None:
    """The 9 measured conditions of a GPU grid (llama-1b, 1 or 2 GPUs) as the machine's truth, no history.

    On the H100 grid, with ZeRO stage as the only order of work, the search probed 4 (z3-mb1 stayed
    open: its prior spanned [360, 3098] ms and no mb1 was measured); with the micro-batch order it
    stops at 3. Its winner is within 3% of the grid's best on every grid.
    """
    import json

    from dstui.analysis.forecast import forecastable_shape
    from dstui.analysis.time_fit import Observation, TimeModel
    from dstui.analysis.time_model import gpu_hardware, terms
    from dstui.spec.loading import load_spec

    grid = json.loads((REPO / "benchmarks/results" / folder / "compare.json").read_text())["grid"]
    sp = load_spec(REPO / "benchmarks/gpu" / spec_file)
    hw, capacity = gpu_hardware(gpu), gib * 2**30
    cs = [c for c in cands.build(sp, cuda=True, capacity=capacity) if c.open]
    t_of = {c.name: terms(c.settings, forecastable_shape(c.settings), hw) for c in cs}
    measured: dict[str, StepTime] = {}
    observations: list[Observation] = []
    while True:
        model = TimeModel(hw, observations).fit()
        preds = {n: model.predict(t) for n, t in t_of.items() if n not in measured}
        best = min(measured, key=lambda n: measured[n].mean) if measured else None
        top = search.Best(best, measured[best]) if best else None
        d = search.decide(cs, preds, top, confidence=sp.tune.confidence, margin=sp.tune.margin, measured=measured,
                          capacity=capacity)  # fmt: skip
        if d.candidate is None:
            break
        g = grid[d.candidate]
        measured[d.candidate] = StepTime(g["step_s"], g["half_s"], 6)
        observations.append(Observation(t_of[d.candidate], g["step_s"], measured[d.candidate].rel_sd))
    assert len(cs) == len(grid) == 9 and len(measured) == probes <= 3, (sorted(measured), d.why)
    grid_best = min(g["step_s"] for g in grid.values())
    assert grid[min(measured, key=lambda n: measured[n].mean)]["step_s"] <= 1.03 * grid_best
    assert "doing more work than a measured probe: " in d.why, d.why


def test_the_printed_winner_names_the_probes_it_was_not_told_apart_from(capsys: pytest.CaptureFixture[str]) -> None:
    from dstui.commands.tune import print_outcome

    def row(name: str, s: float, half: float, *, winner: bool = False, tie: bool = False) -> dict:
        return {"candidate": name, "predicted_s": s, "measured_s": s, "measured_half_s": half, "error_pct": 0.0,
                "tokens_per_s": 1000.0, "mem_peak": None, "outcome": "ranked", "wall_s": 9.0, "winner": winner,
                "within_noise_of_winner": tie}  # fmt: skip

    doc = {"ranking": [row("z1-mb4", 0.0272, 0.0013, winner=True), row("z0-mb4", 0.0278, 0.0033, tie=True),
                       row("z2-mb4", 0.0617, 0.0073)], "candidates": 12, "left_out": [], "not_probed": [],
           "cost": {"probes": 3, "probe_wall_s": 80.0, "search_wall_s": 90.0, "gpu_s": 0.0}, "stop_reason": "x",
           "winner": "z1-mb4", "winner_spec": "w.yaml", "report": "r.md"}  # fmt: skip
    print_outcome(doc)
    out = capsys.readouterr().out
    assert "winner: z1-mb4 (not told apart from z0-mb4: their 95% intervals overlap); its spec: dstui run w.yaml" in out
    doc["ranking"][1]["within_noise_of_winner"] = False
    print_outcome(doc)
    assert "winner: z1-mb4; its spec" in capsys.readouterr().out
