"""The executor registry without processes: names, where they come from, what the spec and the registry do with them.

The end-to-end proof that a backend from outside dstui works is tests/e2e/test_executor_backend.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dstui.core import executors
from dstui.core.errors import DstuiError, SpecError
from dstui.core.rundir import RunDir, merge_status, write_json_atomic
from dstui.execute import backends, feasibility
from dstui.execute.backends.base import Backend
from dstui.execute.backends.local import LocalBackend
from dstui.execute.backends.slurm import SlurmBackend
from dstui.spec.expand import expand
from dstui.spec.loading import parse_spec


def test_environment_entries_are_read_and_bad_ones_left_out() -> None:
    found = executors.from_environment(
        "mine=site.backend:Mine, two=pkg.mod:Two+nodes,local=evil:Local,bad name=x:Y,noclass=pkg.mod,=a:B"
    )
    assert found == {
        "mine": executors.Entry("site.backend:Mine"),
        "two": executors.Entry("pkg.mod:Two", places_nodes=True),
    }  # a built-in name is never redirected; a malformed entry registers nothing


def test_the_spec_accepts_exactly_the_registered_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(executors.ENV, raising=False)
    with pytest.raises(SpecError, match=r"must be one of 'local', 'slurm' \(got 'mine'\)"):
        parse_spec({"name": "x", "executor": "mine"})
    monkeypatch.setenv(executors.ENV, "mine=site.backend:Mine")
    assert parse_spec({"name": "x", "executor": "mine"}).executor == "mine"


def test_nodes_without_a_hostfile_need_an_executor_that_places_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(executors.ENV, "mine=site.backend:Mine,cluster=site.backend:Cluster+nodes")
    two_nodes = {"settings": {"nodes": 2}}
    assert expand(parse_spec({"name": "x", "executor": "cluster", **two_nodes}))[0].settings.nodes == 2
    for name in ("local", "mine"):
        with pytest.raises(SpecError) as e:
            expand(parse_spec({"name": "x", "executor": name, **two_nodes}))
        assert e.value.message == "nodes > 1 needs launcher.hostfile (or executor: slurm or executor: cluster)"


def test_unknown_or_unloadable_backends_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(executors.ENV, "gone=no_such_module_here:Backend,typo=dstui.execute.backends.local:Nope")
    for name, words in (("nope", "unknown executor 'nope'; known: local, slurm, gone, typo"),
                        ("gone", "executor 'gone': cannot load no_such_module_here:Backend (ModuleNotFoundError"),
                        ("typo", "executor 'typo': cannot load dstui.execute.backends.local:Nope (AttributeError")):  # fmt: skip
        with pytest.raises(DstuiError) as e:
            backends.get(name)
        assert str(e.value).startswith(words) and "\n" not in str(e.value)


@pytest.mark.parametrize("cls", [LocalBackend, SlurmBackend])
def test_builtin_backends_answer_every_method_of_the_protocol(cls: type) -> None:
    wanted = {n for n in vars(Backend) if not n.startswith("_")} | set(Backend.__annotations__)
    assert wanted <= set(dir(cls({}))), wanted - set(dir(cls({})))


def test_a_run_not_started_yet_goes_to_its_batch_backend(tmp_path: Path) -> None:
    batch = tmp_path / "b"
    rd = RunDir(batch / "r-r0")
    merge_status(rd, dict(state="queued"))
    write_json_atomic(batch / "batch.json", {"id": "b", "executor": "slurm"})
    assert backends.for_run(rd).name == "slurm"  # queued, no job yet: the batch says where it will go
    rd.update_status(executor="local")
    assert backends.for_run(rd).name == "local"  # started: its own status says
    assert backends.get("slurm") is backends.get("slurm")  # one shared instance per name (Slurm's squeue cache)
    assert backends.for_batch({"executor": "slurm"}) is not backends.get("slurm")  # the supervisor's is its own


def test_without_a_machine_no_run_is_judged_here() -> None:
    """Slurm places its runs: this machine's GPUs and cores say nothing about them (sbatch --test-only does)."""
    spec = parse_spec({"name": "x", "executor": "slurm", "settings": {"gpus": 64}})
    runs = expand(spec)
    assert backends.get("slurm").capacity() is None and feasibility.problems(runs, None) == []
    assert feasibility.problems(runs, feasibility.Machine(gpus=0, cpu_cores=2))[0].field == "gpus"
