"""The sp-check's tensor comparison (runners/sp_tensors.py) and its bookkeeping, on known tensors.

The pieces are cut from a reference tensor the way Ulysses and the ring split it (their Place
helpers), in one process (a one-rank gloo group: the comparison's sums are collective). The
real launches (tests/e2e/test_sp.py) show the same on DeepSpeed's own exchange.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "runners"))

import ring  # noqa: E402
import sp_probe  # noqa: E402
import sp_tensors  # noqa: E402
import ulysses  # noqa: E402
from common import RunnerError  # noqa: E402
from helpers import IMPORTS_DEEPSPEED  # noqa: E402

torch = pytest.importorskip("torch")
pytestmark = IMPORTS_DEEPSPEED  # one worker pays the DeepSpeed import (the mpu test)

B, H, KV, S, D = 1, 4, 4, 16, 3


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Layer:  # what the probe reads of an attention module
    def __init__(self, idx: int) -> None:
        self.layer_idx = idx


def _reference(layers: int = 2) -> sp_probe.Probe:
    """A no-SP capture: q [b, h, s, d], k/v [b, kv, s, d], o [b, s, h, d] per layer."""
    gen = torch.Generator().manual_seed(0)
    ref = sp_probe.Probe([0, -1])
    ref.resolve(layers)
    for layer in range(layers):
        for name, shape in (("q", (B, H, S, D)), ("k", (B, KV, S, D)), ("v", (B, KV, S, D)), ("o", (B, S, H, D))):
            t = torch.randn(*shape, generator=gen)
            ref.take(_Layer(layer), sp_probe.REFERENCE, name, t, sp_probe.Place(name))
    return ref


def _ulysses_capture(ref: sp_probe.Probe, sp: int, *, roll_v_at: int | None = None) -> sp_probe.Probe:
    """What every rank of a correct Ulysses run would capture, all in one probe (parts = ranks)."""
    args = argparse.Namespace(sequence_parallel=sp, seq_length=S)
    out = sp_probe.Probe(ref.wanted)
    out.resolve(2)
    out.stages.update(ulysses.STAGES)
    for rank in range(sp):
        for stage, places in ulysses._places(args, H, KV, rank).items():
            for name, place in places.items():
                for layer in ref.layers:
                    full = ref.pieces[(layer, sp_probe.REFERENCE, place.base)][0][0]
                    piece, _, _ = sp_tensors._select(full, place)
                    if layer == roll_v_at and (stage, name) == ("exchanged", "v"):
                        piece = piece.roll(1, dims=1)
                    out.take(_Layer(layer), stage, name, piece, place, part=rank)
    return out


def test_a_correct_split_matches_exactly(group: None) -> None:
    ref = _reference()
    rows = sp_tensors.compare(_ulysses_capture(ref, 2), ref, {}, "fp32", "cpu")
    assert len(rows) == 2 * (3 + 3 + 1 + 1)  # layers x (q/k/v before, q/k/v after, attention, returned)
    ok, margin, first = sp_tensors.verdict(rows)
    assert ok and first is None and margin == float("inf")
    assert all(r.rel == 0 for r in rows)


def test_rotated_value_heads_are_named_at_their_layer_and_stage(group: None) -> None:
    ref = _reference()
    rows = sp_tensors.compare(_ulysses_capture(ref, 2, roll_v_at=1), ref, {}, "bf16", "cpu")
    ok, margin, first = sp_tensors.verdict(rows)
    assert not ok and margin < 0.1
    assert (first.layer, first.stage, first.name) == (1, "exchanged", "v")
    assert first.label == "after the all-to-all" and first.rel > 0.5
    assert first.head in range(KV) and first.token in range(S)  # a reference coordinate
    assert "layer 1, v after the all-to-all" in first.words()
    assert [r.ok for r in rows if r.layer == 0] == [True] * 8  # layer 0 untouched


def test_a_missing_piece_fails_as_not_captured(group: None) -> None:
    ref = _reference()
    sp = _ulysses_capture(ref, 2)
    del sp.pieces[(0, "attention", "o")]
    ok, _, first = sp_tensors.verdict(sp_tensors.compare(sp, ref, {}, "fp32", "cpu"))
    assert not ok and (first.layer, first.stage, first.captured) == (0, "attention", False)
    assert "NOT CAPTURED" in "\n".join(sp_tensors.lines([first]))


def test_measured_noise_raises_the_tolerance_above_the_dtype_floor(group: None) -> None:
    ref = _reference()
    twin = sp_probe.Probe(ref.wanted)
    twin.resolve(2)
    for (layer, stage, name), parts in ref.pieces.items():
        t = parts[0][0]
        twin.take(_Layer(layer), stage, name, t * (1 + 0.02), parts[0][1])  # 2% off: rel 0.02
    noise = sp_tensors.noise(ref, twin, "cpu")
    assert noise[(0, "q")] == pytest.approx(0.02, rel=1e-5)
    rows = sp_tensors.compare(_ulysses_capture(ref, 2), ref, noise, "fp32", "cpu")
    assert all(r.tol == pytest.approx(4 * 0.02, rel=1e-5) for r in rows)
    assert "4 x measured noise (up to 0.02)" in sp_tensors.tolerance_words("fp32", noise)
    assert sp_tensors.tolerance_words("bf16", {}) == "bf16 floor 0.031 (no noise run)"


def test_gqa_places_repeat_kv_heads_when_there_are_more_ranks() -> None:
    args = argparse.Namespace(sequence_parallel=4, seq_length=S)
    kv = [ulysses._places(args, 4, 2, r)["exchanged"]["k"].heads for r in range(4)]
    assert kv == [(0,), (0,), (1,), (1,)]  # DeepSpeed repeats each KV head to every rank that needs it
    q = [ulysses._places(args, 4, 2, r)["exchanged"]["q"].heads for r in range(4)]
    assert q == [(0,), (1,), (2,), (3,)]


@given(sp=st.integers(1, 8), chunk=st.integers(1, 16))
def test_ring_slots_partition_the_sequence_in_equal_halves(sp: int, chunk: int) -> None:
    seq = 2 * sp * chunk
    seen = []
    for slot in range(sp):
        spans = ring.chunk_tokens(seq, sp, slot)
        assert [b - a for a, b in spans] == [chunk, chunk]
        seen += [t for a, b in spans for t in range(a, b)]
    assert sorted(seen) == list(range(seq))


def test_layers_are_parsed_and_resolved_with_clear_errors() -> None:
    assert sp_probe.resolve_layers(sp_probe.parse_layers("0,-1"), 12) == (0, 11)
    assert sp_probe.resolve_layers([1, -11, 1], 12) == (1,)
    with pytest.raises(RunnerError, match="the model has 2 layers"):
        sp_probe.resolve_layers([5], 2)
    with pytest.raises(RunnerError, match="not a comma-separated list of integers"):
        sp_probe.parse_layers("first,last")
    with pytest.raises(RunnerError, match="at least one layer"):
        sp_probe.parse_layers(" , ")


def test_the_probe_takes_each_piece_once_and_nothing_after_stop() -> None:
    p = sp_probe.Probe([0])
    p.resolve(2)
    stopped = []
    p.on_stop(lambda: stopped.append(True))
    p.take(_Layer(0), "shard", "q", torch.ones(2), sp_probe.Place("q"))
    p.take(_Layer(0), "shard", "q", torch.zeros(2), sp_probe.Place("q"))  # a recompute: ignored
    p.take(_Layer(1), "shard", "q", torch.ones(2), sp_probe.Place("q"))  # not a chosen layer
    p.stop()
    p.stop()
    p.take(_Layer(0), "shard", "k", torch.ones(2), sp_probe.Place("k"))
    assert list(p.pieces) == [(0, "shard", "q")] and float(p.pieces[(0, "shard", "q")][0][0].sum()) == 2
    assert stopped == [True]


def test_the_no_sp_engines_start_without_the_sp_runs_mpu(group: None) -> None:
    """DeepSpeed keeps the SP mpu in groups.mpu; under it the data-parallel group is None (DeepCompile's SIGSEGV)."""
    import deepspeed
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as sp_state
    import process_group
    import sp_check
    from deepspeed.utils import groups

    process_group.skip_unused_shm_op()  # as the runners do: no JIT build of the shm op here (minutes on CI)
    deepspeed.comm.init_distributed("gloo")  # wraps the group torch already has
    try:
        groups.mpu = sp_state  # what deepspeed.initialize(mpu=...) of the SP run leaves behind
        assert groups._get_data_parallel_group() is None
        sp_check.clean_state()
        assert groups.mpu is None and groups._get_data_parallel_group() is not None
    finally:  # this worker's later tests must not find a DeepSpeed backend on a group that is gone
        groups.mpu = None
        groups._WORLD_GROUP = None
        deepspeed.comm.comm.cdb = None


def test_the_noise_run_is_compiled_as_the_sp_run_and_says_so() -> None:
    import sp_check

    base = argparse.Namespace(sequence_parallel=2, sp_mode="eager", compile=False, deepcompile=False)
    cases = {("deepcompile", False): ("no-SP eager vs no-SP DeepCompile", False, True),
             ("eager", True): ("no-SP eager vs no-SP DeepCompile", False, True),  # deepcompile: true + Ulysses
             ("compile", False): ("no-SP eager vs no-SP torch.compile", True, False),
             ("ring", False): ("no-SP run repeated", False, False),
             ("eager", False): ("no-SP run repeated", False, False)}  # fmt: skip
    for (mode, dc), (words, compiled, deepcompiled) in cases.items():
        twin, what = sp_check.noise_twin(argparse.Namespace(**{**vars(base), "sp_mode": mode, "deepcompile": dc}))
        assert (what, twin.compile, twin.deepcompile) == (words, compiled, deepcompiled)
    cfg = {"compile": {"deepcompile": True}, "zero_optimization": {"stage": 1}}
    assert sp_check.eager_config(cfg) == {"zero_optimization": {"stage": 1}} and cfg["compile"]  # a copy


def test_the_capture_runs_one_forward_without_grad_and_gives_training_the_same_batches() -> None:
    """runners/sp_probe.capture: what training then sees (data order, random draws) is what it saw without it."""
    p = sp_probe.Probe([0])
    p.resolve(1)
    stopped: list[bool] = []
    p.on_stop(lambda: stopped.append(True))
    batches = [{"input_ids": torch.full((1, 4), i)} for i in range(3)]
    seen = []

    def forward(batch: dict) -> None:
        seen.append((int(batch.pop("input_ids")[0, 0]), torch.is_grad_enabled(), p.active))
        torch.rand(5)  # a dropout's draw: it must not shift training's random numbers
        p.take(_Layer(0), "shard", "q", torch.ones(2), sp_probe.Place("q"))

    torch.manual_seed(3)
    expected_draw = torch.rand(2)
    torch.manual_seed(3)
    rest = sp_probe.capture(p, forward, iter(batches), [])
    assert torch.equal(torch.rand(2), expected_draw)
    assert seen == [(0, False, True)] and stopped == [True] and not p.active
    assert list(p.pieces) == [(0, "shard", "q")]
    assert [int(b["input_ids"][0, 0]) for b in rest] == [0, 1, 2]  # the first batch still first, and whole
