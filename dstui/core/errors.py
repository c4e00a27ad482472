"""Errors a user can act on.

Every bad input ends in a :class:`SpecError` that names the file, the
condition and the field, so the CLI and the TUI print one readable line
instead of a traceback.
"""

from __future__ import annotations


class DstuiError(Exception):
    """Base class: anything raised as this is shown to the user as a message."""


class SpecError(DstuiError):
    """A spec, a template or a generated DeepSpeed config is invalid."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        condition: str | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.condition = condition
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.file:
            where.append(str(self.file))
        if self.condition:
            where.append(f"condition '{self.condition}'")
        if self.field:
            where.append(f"field '{self.field}'")
        prefix = ": ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


class LockHeld(DstuiError):
    """Another dstui process already supervises this batch."""


class NotFound(DstuiError):
    """What was asked for (a batch, a run, a pattern's matches) does not exist: exit status 3."""
