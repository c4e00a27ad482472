"""A compact checkbox that reads as on/off without colour: `[x] 1` / `[ ] 1`."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Checkbox


class Toggle(Checkbox):
    DEFAULT_CSS = """
    Toggle { width: auto; height: 1; border: none; padding: 0; background: transparent; }
    Toggle:focus { background: $block-cursor-background; color: $block-cursor-foreground; }
    Toggle:hover { background: $boost; }
    """

    def __init__(self, label: str, value: bool = False, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(label, value, id=id, classes=classes, compact=True)

    @property
    def _button(self) -> Content:
        style = "bold $success" if self.value else "$text-muted"
        return Content.styled("[x]" if self.value else "[ ]", style)
