"""Text from a run, a spec or a log, made harmless for a terminal (issue 40.4).

A run's output is untrusted, and a terminal obeys what it prints: a failing job
whose error text held OSC and CSI sequences retitled the user's terminal, cleared
the screen and wrote the clipboard (OSC 52) through `dstui run`'s reason line,
and the TUI passed title and clear through too. Every string that came from a
run, a spec or a log goes through :func:`printable` before it reaches a screen:

* escape sequences are removed whole: CSI (``ESC [ ... final``), OSC, DCS, SOS,
  PM and APC strings up to their BEL or ST, two-character ``ESC x`` sequences,
  and the 8-bit C1 forms (``0x9b``, ``0x9d``, ...);
* every remaining control character goes: C0 (BEL, backspace, ESC alone, ...)
  but tab and newline, DEL, C1, and the bidirectional overrides and isolates
  that make text read in another order than it is (U+202A-202E, U+2066-2069);
* CR: ``\\r\\n`` is a newline, a bare ``\\r`` (which would overwrite the line on
  screen) starts a new one; ``one_line`` turns newlines and tabs into spaces;
* a lone surrogate (undecodable bytes read with ``surrogateescape``) becomes
  U+FFFD: printing one raises UnicodeEncodeError.

It is linear in its input (each pattern starts at a rare character and scans to
the next one at most; benchmarks/scrubber.py) and idempotent. JSON output needs
none of it: ``json.dumps`` escapes every control character (``--json``).
:func:`guard_output` applies it to everything a CLI command prints, a net
under the explicit calls (which come first, so that tables measure the text
they show).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TextIO

_STRING_END = r"(?:\x07|\x1b\\|\x9c)"  # BEL or ST (ESC \, or 8-bit 0x9c)
SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: ESC [ parameters intermediates final
    rf"|\x1b[\]PX^_][^\x07\x1b\x9c]*{_STRING_END}"  # OSC, DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]"  # the other ESC sequences: ESC c, ESC 7, ESC ( B, ...
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
    rf"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]*{_STRING_END}"  # 8-bit DCS, SOS, OSC, PM, APC
)
# left after the sequences: C0 but tab and newline, DEL, C1, bidi marks/overrides/isolates
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATES = re.compile("[\ud800-\udfff]")
_NEEDS_WORK = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_BREAKS = re.compile("[\t\n]")


def printable(text: Any, *, one_line: bool = False) -> str:
    """``text`` (anything; ``str()`` of it) with no escape sequence or control character left.

    Tabs and newlines stay, unless ``one_line``: then they are spaces, so a table
    cell or a one-line message stays one line.
    """
    s = text if isinstance(text, str) else str(text)
    if _NEEDS_WORK.search(s):
        s = SEQUENCES.sub("", s).replace("\r\n", "\n").replace("\r", "\n")
        s = CONTROLS.sub("", s)
        s = _SURROGATES.sub("\ufffd", s)
    return _BREAKS.sub(" ", s) if one_line else s


class FilteredStream:
    """A text stream that hands what is written, through ``fn``, to the stream it wraps."""

    def __init__(self, inner: TextIO, fn: Callable[[str], str]) -> None:
        self.inner = inner
        self.fn = fn

    def write(self, text: str) -> int:
        self.inner.write(self.fn(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self.inner, name)


def filter_output(fn: Callable[[str], str]) -> None:
    """Everything this process prints to stdout and stderr goes through ``fn`` (once, however often asked).

    The filter added last sees the text first: the CLI adds :func:`printable` after
    secrets' masking, so a secret split by an escape sequence is whole when masked.
    """
    import sys

    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        chain = stream
        while isinstance(chain, FilteredStream):
            if chain.fn is fn:
                break
            chain = chain.inner
        else:
            setattr(sys, name, FilteredStream(stream, fn))


def guard_output() -> None:
    """Everything this process prints goes through :func:`printable` (the CLI's commands; not the TUI)."""
    filter_output(printable)
