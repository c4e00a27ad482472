"""A footer whose keys fit the terminal: at 80 columns Textual's footer cuts the row where it runs out.

Textual lays the footer's keys out left to right and clips what does not
fit, so on a narrow terminal the last keys vanish, and the app's own keys
(``?`` help, ``q`` quit) come last. This footer keeps the keys that fit in an
order of importance instead: ``?`` always (it lists every key), then the
screen's own keys in the order the screen declares them, then quit, then the
screen switches; the command palette's key is the first to go. When keys are
left out, the help key says how many (``Help +4``), so a user knows the row
is not the whole story.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.events import Resize
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

HELP_ACTION = "help"
QUIT_ACTION = "quit"


def key_width(key: FooterKey) -> int:
    """Columns one key takes in the non-compact footer: ' k ' + 'description '."""
    if key.has_class("-command-palette"):
        return len(key.key_display) + len(key.description) + 5  # its border and right padding too
    return len(key.key_display) + 2 + (len(key.description) + 1 if key.description else 0)


def _rank(key: FooterKey, index: int) -> tuple[int, int]:
    """Lower is kept first: help, the screen's keys, quit, app-wide switches, the palette."""
    action = key.action.removeprefix("app.")
    if action == HELP_ACTION:
        return (0, index)
    if key.has_class("-command-palette"):
        return (4, index)
    if action == QUIT_ACTION:
        return (2, index)
    if action.startswith("goto("):
        return (3, index)
    return (1, index)


def fit_keys(keys: list[FooterKey], width: int) -> tuple[list[FooterKey], int]:
    """The keys to show within ``width`` columns (in their original order) and how many were left out.

    The help key's own "+N" is counted in its width before anything is chosen,
    so the row never overflows because of the note it adds.
    """
    if sum(key_width(k) for k in keys) <= width:
        return keys, 0
    order = sorted(range(len(keys)), key=lambda i: _rank(keys[i], i))
    chosen: set[int] = set()
    used = len(" +99")  # the note on the help key
    for i in order:
        w = key_width(keys[i])
        if used + w <= width or _rank(keys[i], i)[0] == 0:
            chosen.add(i)
            used += w
    return [k for i, k in enumerate(keys) if i in chosen], len(keys) - len(chosen)


class FittingFooter(Footer):
    """Textual's footer, with the keys chosen to fit its width (see the module docstring)."""

    def compose(self) -> ComposeResult:
        widgets: Iterable[Widget] = list(super().compose())
        keys = [w for w in widgets if isinstance(w, FooterKey)]
        if len(keys) != len(list(widgets)):  # key groups: leave Textual's layout alone
            yield from widgets
            return
        width = self.size.width or self.app.size.width
        shown, left_out = fit_keys(keys, width)
        for key in shown:
            if left_out and key.action.removeprefix("app.") == HELP_ACTION:
                key.description = f"{key.description} +{left_out}"
        self.styles.grid_size_columns = len(shown)
        yield from shown

    _fitted_to = 0

    def on_resize(self, event: Resize) -> None:
        if event.size.width != self._fitted_to:  # a new width may fit more or fewer keys
            self._fitted_to = event.size.width
            self.refresh(recompose=True)
