"""The footer at 80 columns: the help key is always there and says how many keys it hides."""

from __future__ import annotations

import pytest
from helpers import HEAVY
from hypothesis import given, settings
from hypothesis import strategies as st
from textual.widgets._footer import FooterKey
from tui_helpers import wait_for

from dstui.tui.app import DstuiApp
from dstui.tui.widgets.fitting_footer import FittingFooter, fit_keys, key_width

pytestmark = pytest.mark.anyio

WORDS = st.text(alphabet="abcdefghij /", min_size=1, max_size=18)


def _key(i: int, desc: str, action: str) -> FooterKey:
    return FooterKey(f"k{i}", f"k{i}", desc, action)


@st.composite
def footers(draw: st.DrawFn) -> list[FooterKey]:
    descs = draw(st.lists(WORDS, min_size=1, max_size=14))
    keys = [_key(i, d, draw(st.sampled_from(["mine", "goto('runs')", "app.quit"]))) for i, d in enumerate(descs)]
    keys.insert(draw(st.integers(0, len(keys))), FooterKey("question_mark", "?", "Help", "app.help"))
    return keys


@settings(max_examples=300, deadline=None)
@given(keys=footers(), width=st.integers(20, 200))
def test_the_keys_chosen_fit_keep_help_order_and_leave_no_room(keys: list[FooterKey], width: int) -> None:
    shown, left_out = fit_keys(keys, width)
    assert any(k.action == "app.help" for k in shown)
    assert left_out == len(keys) - len(shown)
    assert [keys.index(k) for k in shown] == sorted(keys.index(k) for k in shown)
    if left_out:
        used = sum(key_width(k) for k in shown) + len(" +99")
        assert used <= width
        # nothing was left out that would still fit in the room left over
        assert all(key_width(k) > width - used for k in keys if k not in shown)
    else:
        assert shown == keys


def _footer_keys(app: DstuiApp) -> tuple[list[str], int]:
    footers = app.screen.query(FittingFooter)
    keys = list(footers.first().query(FooterKey)) if footers else []
    return [f"{k.key_display} {k.description}" for k in keys], sum(key_width(k) for k in keys)


async def _footer_text(app: DstuiApp, pilot, screen: str | None = None) -> tuple[list[str], int]:  # noqa: ANN001
    """The footer's keys once ``screen`` (a class name's start) is shown and its footer has been composed.

    A screen switch recomposes the footer on a later refresh: one pause was not always enough under
    load 10-16 (issue 39), and the keys read then were the old screen's or none.
    """

    def composed() -> bool:
        return type(app.screen).__name__.lower().startswith(screen or "") and any(
            t.startswith("? Help") for t in _footer_keys(app)[0]
        )

    await wait_for(pilot, composed, timeout=60)
    return _footer_keys(app)


SCREENS = {"1": "compose", "2": "runs", "3": "results"}


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
@HEAVY
async def test_every_screen_shows_help_within_the_width(tui_env, size: tuple[int, int]) -> None:  # noqa: ANN001
    app = DstuiApp(supervise=False)
    async with app.run_test(size=size) as pilot:
        for screen_key, screen in SCREENS.items():
            await pilot.press(screen_key)
            texts, used = await _footer_text(app, pilot, screen)
            helps = [t for t in texts if t.startswith("? Help")]
            assert helps, (screen_key, texts)
            assert used <= size[0], (screen_key, texts)
            if size[0] == 80 and screen_key == "3":  # Results has more keys than 80 columns hold
                assert helps[0] != "? Help" and "+" in helps[0], texts


@HEAVY
async def test_a_wider_terminal_brings_the_keys_back(tui_env) -> None:  # noqa: ANN001
    app = DstuiApp(supervise=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        narrow, _ = await _footer_text(app, pilot, "results")
        await pilot.resize_terminal(200, 36)
        await wait_for(pilot, lambda: len(_footer_keys(app)[0]) > len(narrow), timeout=60)
        wide, used = await _footer_text(app, pilot, "results")
    assert len(wide) > len(narrow) and "? Help" in wide and used <= 200
