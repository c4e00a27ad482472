"""Compose screen: edit -> expand -> save -> `dstui list` gives the same runs; inline errors."""

from __future__ import annotations

import shutil

import pytest
import yaml
from helpers import HEAVY, IMPORTS_DEEPSPEED
from textual.widgets import Input, Static
from tui_helpers import REPO, run_cli, wait_for

from dstui.spec.loading import expand_file
from dstui.tui.app import DstuiApp
from dstui.tui.screens.compose import ComposeScreen

pytestmark = [pytest.mark.anyio, IMPORTS_DEEPSPEED]


def listed(path) -> list[tuple[str, str]]:  # noqa: ANN001
    """(run name, key) pairs of `dstui list --no-validate --json`."""
    import json

    out = run_cli("list", "--no-validate", "--json", str(path))  # stdout and stderr: the document is the JSON
    rows = [(r["run"], r["key"]) for r in json.loads(out[out.index("{") : out.rindex("}") + 1])["runs"]]
    assert rows
    return rows


@HEAVY
async def test_compose_new_spec_save_then_list(tui_env):  # noqa: F811
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        path = tui_env / "specs" / "mine.yaml"
        inp = screen.query_one("#path", Input)
        inp.focus()
        inp.value = str(path)
        await pilot.press("enter")
        await pilot.pause()
        assert screen.query_one("#name", Input).value == "mine"
        # ZeRO 1 and 2 on top of the default 0, two micro batches, two repeats
        for box in ("#ck-zero_stage-1", "#ck-zero_stage-2"):
            screen.query_one(box).focus()
            await pilot.press("space")
        mb = screen.query_one("#in-micro_batch", Input)
        mb.focus()
        mb.value = ""
        await pilot.press("1", ",", " ", "2")
        rep = screen.query_one("#repeats", Input)
        rep.focus()
        rep.value = ""
        await pilot.press("2")
        await pilot.pause()
        assert len(screen.runs) == 3 * 2 * 2
        assert "12 runs" in str(screen.query_one("#count", Static).render())
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert path.is_file()
        ui = [(r.name, r.key) for r in screen.runs]
    assert listed(path) == ui
    _, runs = expand_file(path)
    assert [(r.name, r.key) for r in runs] == ui


@HEAVY
async def test_compose_open_existing_edit_roundtrip(tui_env):  # noqa: F811
    src = tui_env / "smoke.yaml"
    shutil.copy(REPO / "configs/experiments/smoke.yaml", src)
    app = DstuiApp(spec_path=src, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("1")
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        assert [r.name for r in screen.runs] == ["z0-r0", "z1-r0", "z2-r0", "z3-r0"]
        # drop ZeRO 0, add DeepCompile on/off: 3 x 2 conditions
        screen.query_one("#ck-zero_stage-0").focus()
        await pilot.press("space")
        screen.query_one("#ck-deepcompile-1").focus()
        await pilot.press("space")
        await pilot.pause()
        assert len(screen.runs) == 6
        # ZeRO 0 went, and with it the baseline z0: the runs stay listed, the spec says why it is not whole
        assert "field 'baseline': 'z0' is not a condition" in (screen.launch_blocker() or "")
        screen.query_one("#baseline", Input).value = screen.runs[0].condition
        assert await wait_for(pilot, lambda: screen.launch_blocker() is None, timeout=20)
        out = tui_env / "edited.yaml"
        await pilot.press("ctrl+t")  # save as
        screen.query_one("#path", Input).value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        ui = [(r.name, r.key) for r in screen.runs]
    assert listed(out) == ui
    saved = yaml.safe_load(out.read_text())
    assert saved["axes"]["zero_stage"] == [1, 2, 3]
    assert saved["axes"]["deepcompile"] == [False, True]
    assert saved["settings"]["model"] == "tiny-llama"  # untouched fields survive


@HEAVY
async def test_compose_flags_invalid_combination_like_cli(tui_env):  # noqa: F811
    path = tui_env / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "bad", "settings": {"steps": 4}, "axes": {"zero_stage": [0, 1]}}))
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("1")
        screen = app.screen
        assert screen.error is None and len(screen.runs) == 2
        screen.query_one("#ck-offload-1").focus()  # offload cpu: invalid with ZeRO 0
        await pilot.press("space")
        await pilot.pause()
        assert screen.runs == []
        assert "offload needs ZeRO stage 1, 2 or 3" in screen.error
        shown = str(screen.query_one("#error", Static).render())
        assert screen.error in shown
        # saving an invalid spec is refused
        await pilot.press("ctrl+s")
        await pilot.pause()
        path2 = tui_env / "bad2.yaml"
        path2.write_text(yaml.safe_dump(screen.data, sort_keys=False))
        ui_error = screen.error.replace(str(path), str(path2))
    cli = run_cli("list", "--no-validate", str(path2))
    assert f"dstui: error: {ui_error}" in cli
    assert yaml.safe_load(path.read_text())["axes"] == {"zero_stage": [0, 1]}  # not overwritten


@HEAVY
async def test_compose_deepspeed_validation_inline(tui_env):  # noqa: F811
    path = tui_env / "ds.yaml"
    path.write_text(yaml.safe_dump({
        "name": "ds", "settings": {"steps": 4, "ds_overrides": {"zero_optimization": {"stag": 1}}},
    }))  # fmt: skip
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("1")
        dsv = app.screen.query_one("#dsvalid", Static)
        ok = await wait_for(pilot, lambda: "✗" in str(dsv.render()), timeout=120)
        assert ok, str(dsv.render())
        assert "unknown key 'stag'; did you mean 'stage'?" in str(dsv.render())


async def test_compose_marks_runs_this_machine_cannot_do(tui_env):  # noqa: F811
    """The check `dstui run` refuses by: DeepCompile and 6 ranks on this CPU box are marked and said why."""
    from dstui.execute import feasibility

    path = tui_env / "impossible.yaml"
    path.write_text(yaml.safe_dump({
        "name": "impossible", "settings": {"steps": 4, "warmup_steps": 1, "torch_adam": True},
        "conditions": [{"name": "dc", "deepcompile": True}, {"name": "six", "gpus": 6}, {"name": "fine"}],
    }))  # fmt: skip
    machine = feasibility.this_machine()
    if machine.gpus or machine.cpu_cores >= 6:
        pytest.skip(f"this machine ({machine.describe()}) can run what the test expects refused")
    app = DstuiApp(spec_path=path, supervise=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("1")
        dsv = app.screen.query_one("#dsvalid", Static)
        ok = await wait_for(pilot, lambda: "cannot work on this machine" in str(dsv.render()), timeout=120)
        text = str(dsv.render())
        assert ok, text
        assert "2 runs cannot work on this machine" in text
        assert "dc-r0: deepcompile=true: DeepCompile needs a CUDA GPU" in text and "six-r0: gpus=6:" in text
        table = app.screen.query_one("#runlist")
        marked = {str(table.get_cell(k, "run")) for k in table.rows}
        assert {"✗ dc-r0", "✗ six-r0", "fine-r0"} <= marked, marked
