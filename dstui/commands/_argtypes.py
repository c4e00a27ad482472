"""argparse types for numbers a user types: refused at parse time (exit 2, one line) when out of range.

A plain ``type=float`` takes ``-1`` or ``nan`` for a tolerance, and the command
then runs and answers something meaningless ("|diff| 0 > -1", a loss check that
is silently off). Each type here names what it accepts in its refusal.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def tolerance(text: str) -> float:
    """A finite number >= 0 (a loss tolerance)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a tolerance is a finite number >= 0 (e.g. 1e-3)")
    return value


def count(minimum: int, what: str = "") -> Callable[[str], int]:
    """A whole number >= ``minimum``; ``what`` says what 0 means where 0 is allowed."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {minimum} or more{what}")
        return value

    parse.__name__ = "count"  # argparse names the type in "invalid count value" when it is not ours
    return parse


def port(text: str) -> int:
    """A TCP port a server can listen on."""
    value = count(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 1-65535")
    return value


def reference(text: str) -> str:
    """A batch or run reference: not empty (an empty pattern matches nothing and reads as 'not found')."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty reference names no batch or run")
    return text
