"""Issue 40.4 and 40.5 in the TUI: a run's escape sequences never reach the terminal; a YAML bomb is a notice.

A failed run whose reason and log hold OSC (retitle, clipboard write), CSI (clear the
screen, colours) and C1 sequences, a BEL and a bare CR, shown on the Runs screen, in the
log viewer, in the live view's log tail and in a toast. What is checked is what Textual
would write to the terminal for the whole screen (the compositor's full frame, through
every widget's line filters): none of the run's sequences is in it, and the text around
them is, whole.
"""

from __future__ import annotations

import re

import pytest
from helpers import HEAVY
from rich.segment import Segment
from textual.color import Color
from textual.widgets import Log
from tui_helpers import fixture_batch, wait_for, write_run

from dstui.tui.app import DstuiApp
from dstui.tui.screens.live import LiveScreen
from dstui.tui.screens.log import LogScreen
from dstui.tui.terminal_filter import TerminalSafe

pytestmark = pytest.mark.anyio

HOSTILE = "boom \x1b]0;PWNED\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07 \x1b[31mred\x1b[0m \x9b2J\x07end\rover"
# what the run's sequences would do, in the forms a terminal obeys (Textual itself writes none of these)
INJECTED = ("\x1b]0;", "\x1b]52;", "\x1b[2J", "\x9b", "\x07", "PWNED", "cm0gLXJmIH4=")


def frame(app: DstuiApp) -> str:
    """What Textual writes to the terminal for the whole screen now."""
    return app.screen._compositor.render_update(full=True).render_segments(app.console)


def assert_clean(app: DstuiApp) -> None:
    shown = frame(app)
    assert [s for s in INJECTED if s in shown] == []


async def test_a_runs_escape_sequences_never_reach_the_terminal(tui_env) -> None:  # noqa: ANN001
    b = fixture_batch(tui_env)
    rd = write_run(b.path, "evil-r0", order=9, state="failed", reason=f"Python: RuntimeError: {HOSTILE}")
    with open(rd / "stdout.log", "a") as fh:
        fh.write(f"[rank0] {HOSTILE}\n")
    b.update_info(runs=[*b.info()["runs"], "evil-r0"])
    app = DstuiApp(batch_id=b.id, supervise=False, watch_s=0.3)
    async with app.run_test(size=(160, 36), notifications=True) as pilot:  # toasts shown, as in a terminal
        screen = app.screen
        assert await wait_for(pilot, lambda: "evil-r0" in screen._rows)
        assert str(screen._rows["evil-r0"][-1]) == "Python: RuntimeError: boom  red end over"
        assert_clean(app)
        app.notify(f"evil-r0: {HOSTILE} [b]not markup[/b]", title=f"FAILED {HOSTILE}")
        await pilot.pause(0.5)
        assert_clean(app)
        shown = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", frame(app))
        assert "[b]not markup[/b]" in shown, shown  # a reason is never read as markup
        table = screen.query_one("#runs")
        table.move_cursor(row=list(screen._rows).index("evil-r0"))
        await pilot.press("o")
        assert await wait_for(pilot, lambda: isinstance(app.screen, LogScreen))
        log = app.screen.query_one(Log)
        assert await wait_for(pilot, lambda: any("boom" in line for line in log.lines))
        assert [line for line in log.lines if "boom" in line] == ["[rank0] boom  red end over"]
        assert_clean(app)
        await pilot.press("escape")
        await pilot.press("v")
        assert await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen))
        tail = app.screen.query_one("#log-tail", Log)
        for _ in range(5):  # n: the next run's log, until the hostile one's
            if await wait_for(pilot, lambda: any("boom" in line for line in tail.lines), timeout=3):
                break
            await pilot.press("n")
        assert [line for line in tail.lines if "boom" in line] == ["[rank0] boom  red end over"]
        assert_clean(app)


def test_the_line_filter_removes_any_control_character_left_and_keeps_textuals_own() -> None:
    cursor = Segment("\x1b[5;1H", None, [(1, 5, 1)])  # a control segment: Textual's cursor move
    line = [Segment("a\x1b[2Jb\x07"), cursor, Segment("\u202eevil"), Segment("plain")]
    out = TerminalSafe().apply(line, Color(0, 0, 0))
    assert [s.text for s in out] == ["a[2Jb", "\x1b[5;1H", "evil", "plain"]
    assert out[1] is cursor
    assert TerminalSafe().apply(line[3:], Color(0, 0, 0)) == line[3:]


@HEAVY
async def test_compose_refuses_a_yaml_bomb_in_one_line(tui_env) -> None:  # noqa: ANN001
    """Issue 40.5 in the TUI: opening a billion-laughs spec in Compose is a one-line notice; nothing is loaded."""
    import sys

    from textual.widgets import Input
    from tui_helpers import REPO, open_compose

    sys.path.insert(0, str(REPO / "tests" / "programs"))
    from yaml_bombs import specs

    bomb = tui_env / "bomb.yaml"
    bomb.write_text(specs()["billion laughs"])
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(120, 36)) as pilot:
        screen = await open_compose(pilot)
        path = screen.query_one("#path", Input)
        path.focus()
        path.value = str(bomb)
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: any("refused" in n.message for n in app._notifications), timeout=10)
        (note,) = [n.message for n in app._notifications if "refused" in n.message]
        assert note == f"{bomb}: refused: the YAML stands for more than 100,000 values once its aliases are expanded (at line 7)"
        assert screen.path != bomb.resolve()  # the bomb was not opened
