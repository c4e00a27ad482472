"""Markdown formatting of the report: escaping of untrusted text, tables, code, number cells.

Everything a report shows that comes from a run or a spec (names, reasons, argv,
log excerpts, params, tags, descriptions) is untrusted: a run's error text may
hold ``<script>``, a condition name may hold ``|`` or ``](javascript:...)``. The
rule (issue 33.6) lives here, once:

* :func:`esc` turns any text into inline markdown that renders as exactly that
  text and creates no element (every ASCII punctuation character is
  backslash-escaped, line breaks become spaces);
* :func:`code` and :func:`fence` put text in a code span or a fenced block whose
  fence no text can close, where HTML is inert;
* :func:`table` escapes every cell that is not :class:`Md` (markdown that dstui
  wrote itself), and ``|`` and line breaks in every cell, so a section that
  passes raw run text to a table is safe without thinking about it;
* :func:`img` links only to chart files in the report's own folder;
* :func:`neutralize` is the net under all of it: :func:`dstui.report.markdown.render`
  parses the finished report as CommonMark and, should any section have let live
  HTML or a foreign link through, escapes the lines that hold it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from dstui.core.formatting import fmt_sig

if TYPE_CHECKING:  # pragma: no cover
    from dstui.analysis.stats import ConditionStats
    from dstui.report.context import ReportContext

# params that name a run rather than set it up: never "settings that differ"
IDENTITY_PARAMS = frozenset({"seed", "nvme_path", "hung_after_s", "run_key", "revision", "repeat"})

MAX_CELL = 2000  # characters of one untrusted value in a table cell or sentence


class Md(str):
    """Markdown that dstui wrote itself (bold, code spans of escaped text): passed through as is."""


# characters that make inline markup anywhere in a line: code, emphasis, links/images, HTML, autolinks,
# entities, table cells, strikethrough, backslash escapes
_INLINE = re.compile(r"([\\`*\[\]<&|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")  # '_' inside a word never emphasizes
# what starts a block at the start of a line: heading, list, quote, setext underline, ordered list
_BLOCK_START = re.compile(r"^([#+=>-]|\d{1,9}[.)])")
_BREAKS = re.compile(r"\r\n|[\r\n\t\f\v]")
_PIPE = re.compile(r"(?<!\\)\|")
_BACKTICKS = re.compile(r"`+")


def _bound(text: str, limit: int = MAX_CELL) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def esc(text: Any, limit: int = MAX_CELL, *, line_start: bool = True) -> Md:
    """Any value as inline markdown that shows exactly its text and creates no element.

    The characters that make inline markup are backslash-escaped everywhere;
    with ``line_start`` (the default: safe wherever the text lands) so is a
    leading ``#``, ``-``, ``1.`` ... that would open a block at the start of a
    line. Line breaks and tabs become spaces and the ends are stripped (an
    indented line would otherwise become a code block). Other characters stay
    as they are, so ``z0-mb64`` still reads as ``z0-mb64`` in the file.
    """
    s = _INLINE.sub(r"\\\1", _bound(_BREAKS.sub(" ", str(text)).strip(), limit))
    if line_start:
        s = _BLOCK_START.sub(lambda m: m.group(1)[:-1] + "\\" + m.group(1)[-1], s, count=1)
    return Md(s)


def bold(text: Any) -> Md:
    """``**text**`` with the text escaped."""
    inner = esc(text)
    return Md(f"**{inner}**") if inner else inner


def code(text: Any, limit: int = MAX_CELL) -> Md:
    """An inline code span holding ``text`` (HTML inside a code span is inert); '' for empty text.

    The fence is one backtick longer than the longest run of backticks in the
    text, and padded with spaces when the text starts or ends with a backtick,
    so no text can close it early.
    """
    s = _bound(_BREAKS.sub(" ", str(text)), limit)
    if not s.strip():
        return Md("")
    longest = max((len(m) for m in _BACKTICKS.findall(s)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if s[0] in "` " or s[-1] in "` " else ""
    return Md(f"{ticks}{pad}{s}{pad}{ticks}")


def fence(text: str, info: str = "") -> Md:
    """A fenced code block holding ``text`` verbatim; its fence is longer than any backtick run in it."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    ticks = "`" * max(3, longest + 1)
    info = re.sub(r"[^A-Za-z0-9_+-]", "", info)
    body = text.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
    return Md(f"{ticks}{info}\n{body}\n{ticks}")


def codes(values: Iterable[Any], sep: str = ", ") -> Md:
    """Several values, each as a code span."""
    return Md(sep.join(code(v) for v in values))


def escs(values: Iterable[Any], sep: str = ", ") -> Md:
    """Several values, each escaped."""
    return Md(sep.join(esc(v) for v in values))


def _cell(v: Any) -> str:
    """A table cell: inline content only (no block can start in a cell), so only inline escaping."""
    if isinstance(v, Md):
        return _PIPE.sub(r"\\|", _BREAKS.sub(" ", v))
    return esc(v, line_start=False)


def table(head: Sequence[Any], rows: Sequence[Sequence[Any]]) -> Md:
    """A GFM table; every cell that is not :class:`Md` is escaped (run text can never make markup)."""
    out = ["| " + " | ".join(_cell(h) for h in head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return Md("\n".join(out))


_SAFE_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.(png|csv|json|md)$")


def img(ctx: ReportContext, key: str, alt: str) -> str:
    """A markdown image line for a chart drawn into the report folder ('' when not drawn).

    Only a plain file name in the report's folder is ever linked.
    """
    name = ctx.images.get(key, "")
    if not _SAFE_FILE.match(name) or name.startswith("."):
        return ""
    return f"![{esc(alt)}]({name})\n"


def fnum(v: float | None, digits: int | None = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return f"{v:.{digits}f}" if digits is not None else fmt_sig(v)


def fexp(v: float | None) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return f"{v:.3e}"


def pm(mean: str, std: str | None) -> str:
    return mean if std is None or mean == "n/a" else f"{mean} ± {std}"


def marker(c: ConditionStats) -> str:
    if c.n_usable:
        return "no data"
    if c.n_oom:
        return "OOM"
    if c.n_failed and all(r.reason.startswith("cancelled") for r in c.runs if r.status in ("failed", "killed")):
        return "cancelled"  # stopped by a person, not broken
    if c.n_failed:
        return "failed"
    return c.statuses or "no data"


# -- the net: live HTML or foreign links in a finished report ------------------


def _parser() -> Any:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table")


def local_target(url: str) -> bool:
    """A link or image target inside the report's own folder: a plain relative file name."""
    return bool(_SAFE_FILE.match(url)) and not url.startswith(".")


def problems(markdown: str) -> list[tuple[range, str]]:
    """(source lines, what) of each piece of live HTML or non-local link the markdown renders as CommonMark."""
    found: list[tuple[range, str]] = []
    for tok in _parser().parse(markdown):
        lines = range(*tok.map) if tok.map else range(0, markdown.count("\n") + 1)
        if tok.type == "html_block":
            found.append((lines, f"html block {tok.content[:40]!r}"))
        for child in tok.children or []:
            if child.type == "html_inline":
                found.append((lines, f"inline html {child.content[:40]!r}"))
            elif child.type == "link_open" and not local_target(str(child.attrs.get("href", ""))):
                found.append((lines, f"link to {str(child.attrs.get('href'))[:60]!r}"))
            elif child.type == "image" and not local_target(str(child.attrs.get("src", ""))):
                found.append((lines, f"image from {str(child.attrs.get('src'))[:60]!r}"))
    return found


def _escape_line(line: str) -> str:
    """The line with ``<``, ``[`` and ``]`` escaped outside its code spans."""
    parts = re.split(r"(`+[^`]*`+)", line)
    return "".join(p if p.startswith("`") else re.sub(r"(?<!\\)([<\[\]])", r"\\\1", p) for p in parts)


def neutralize(markdown: str) -> str:
    """The markdown with every line that holds live HTML or a foreign link escaped (a no-op when clean).

    The last resort (should escaping lines not be enough) turns every ``<`` of
    the report into ``&lt;``: uglier, never live.
    """
    for _ in range(3):
        bad = problems(markdown)
        if not bad:
            return markdown
        lines = markdown.split("\n")
        for span, _what in bad:
            for i in span:
                if 0 <= i < len(lines):
                    lines[i] = _escape_line(lines[i])
        markdown = "\n".join(lines)
    return markdown.replace("<", "&lt;") if problems(markdown) else markdown
