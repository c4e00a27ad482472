"""A report as one HTML file that MLflow's artifact preview shows with its images.

MLflow's UI (3.x) renders a markdown artifact without images: an image comes out as
the text ``[alt](link)``. An HTML artifact is shown in a sandboxed iframe loaded from
a ``blob:`` URL, where a relative link resolves to nothing. So the preview is HTML
with every image of the report folder inside it as a ``data:`` URI: it shows in
MLflow and reads the same once downloaded. The markdown becomes HTML through
markdown-it with raw HTML off, so text from runs (names, reasons) stays text.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

MAX_IMAGE_BYTES = 8 << 20  # a chart is ~100 KB; anything this large stays a link
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".svg": "image/svg+xml"}
STYLE = """
body { font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1.5em; max-width: 70em; }
table { border-collapse: collapse; margin: 0.5em 0; } th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; }
code { background: #f3f3f3; padding: 0 0.2em; } img { max-width: 100%; }
"""


def report_html(markdown_text: str, folder: Path, title: str = "dstui report") -> str:
    """The report's markdown as a standalone HTML page; images of ``folder`` embedded."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.validateLink = _allowed_link  # data: only for the images embedded below
    tokens = md.parse(markdown_text)
    for tok in tokens:
        for child in tok.children or []:
            if child.type == "image":
                src = str(child.attrGet("src") or "")
                child.attrSet("src", embedded(src, folder) or src)
    body = md.renderer.render(tokens, md.options, {})
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head>\n<body>\n{body}</body></html>\n")  # fmt: skip


_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _allowed_link(url: str) -> bool:
    """Links markdown-it may write: relative, http(s), mailto (never javascript:, data:, file:...)."""
    m = _SCHEME.match(url.strip())
    return m is None or m.group(0).lower() in ("http:", "https:", "mailto:")


def embedded(src: str, folder: Path) -> str | None:
    """A ``data:`` URI of a relative image inside ``folder``; None when it is not one (left as it is)."""
    mime = IMAGE_TYPES.get(Path(src).suffix.lower())
    if mime is None or _SCHEME.match(src) or src.startswith(("/", "#")):
        return None
    root = folder.resolve()
    path = (root / src).resolve()
    if root not in path.parents or not path.is_file() or path.stat().st_size > MAX_IMAGE_BYTES:
        return None
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"
