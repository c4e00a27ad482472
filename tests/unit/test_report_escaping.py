"""Reports never carry live HTML from untrusted text (issue 33.6).

A batch whose runs carry hostile text in every field a report shows (condition
and run names, failure reasons, argv, a log excerpt, the spec's description,
params, tags, tensor names) goes through the real pipeline (MLflow SQLite store
-> export_report); report.md is rendered as CommonMark with markdown-it-py and
the HTML is parsed with html.parser: no script element, no ``on*`` attribute,
no image or link outside the report's folder, and the hostile text is still
there to read, as text. The escaping helpers are property-tested with
hypothesis: whatever the text, the HTML has no element made from it.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_report import BATCH, EXP, STEPS, log_run, losses, make_parent, store  # noqa: F401

from dstui.report import markdown as report_markdown
from dstui.report import mdformat
from dstui.usecases.report import export_report

XSS = "<img src=x onerror=alert(3)> <script>alert(4)</script>"
REASON = f"RuntimeError('{XSS}')"


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text, of an HTML fragment."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def html_of(md: str) -> Elements:
    from markdown_it import MarkdownIt

    parser = Elements()
    parser.feed(MarkdownIt("commonmark").enable("table").render(md))
    parser.close()
    return parser


def live_html(md: str) -> list[str]:
    """What in the rendered report would run or reach outside: script/iframe..., on* attributes, foreign targets."""
    bad = []
    for tag, attrs in html_of(md).tags:
        if tag in ("script", "iframe", "object", "embed", "style", "svg", "form", "input", "base", "meta", "link"):
            bad.append(f"<{tag}>")
        bad += [f"<{tag} {k}=...>" for k in attrs if k.lower().startswith("on")]
        for key in ("src", "href"):
            if key in attrs and not mdformat.local_target(str(attrs[key])):
                bad.append(f"<{tag} {key}={attrs[key]!r}>")
    return bad


def build_hostile(store: tuple[Any, str, str]) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    note = {"mlflow.note.content": f"Description with {XSS}\n\n# not a heading\n[x](javascript:alert(5))"}
    client.set_tag(parent, "mlflow.note.content", note["mlflow.note.content"])  # the spec's description: the batch's note
    hist = {"iter_time": [(s, 0.1) for s in STEPS], "loss": losses(0.0), "mem_peak": [(s, 2**30) for s in STEPS]}
    log_run(client, exp_id, parent, condition="base", history=hist, tags=note)
    log_run(
        client, exp_id, parent, condition="<b>x</b>|pipe*em*", history=hist,
        params={"model": f"m {XSS}", "zero_stage": 3}, tags={**note, "dstui.hostname": "<script>h</script>"},
    )
    log_run(
        client, exp_id, parent, condition=f"evil {XSS}", status="failed", reason=REASON,
        tags={"dstui.cmd": f"python train.py --name '{XSS}' ``` `", "dstui.bad_metric_lines": "3",
              "dstui.first_bad_line": f"not a number: {XSS}",
              "dstui.version.deepspeed": "<svg onload=alert(6)>"},
    )  # fmt: skip
    log_run(
        client, exp_id, parent, condition="verify-z3", kind="verify", status="done", reason="",
        tags={"dstui.verdict": "<i>PASS</i>", "dstui.worst": json.dumps([{"name": XSS, "kind": "<b>g</b>", "max_abs_diff": 0.5}])},
        metrics={"grad_max_abs_diff": 0.125},
    )  # fmt: skip


def test_report_of_hostile_runs_has_no_live_html(store: tuple[Any, str, str], tmp_path: Path,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    build_hostile(store)
    # the sections must escape by themselves: the CommonMark net is switched off for this report
    monkeypatch.setattr(report_markdown.mdformat, "neutralize", lambda md: md)
    md = export_report(EXP, tmp_path / "rep", batch=BATCH).read_text()
    assert live_html(md) == []
    assert mdformat.problems(md) == []  # no html token at all, not only no dangerous one
    text = "".join(html_of(md).text)
    # still readable as text, in every place it is shown
    assert text.count(REASON) >= 3  # summary, conditions table, runs-without-results table
    assert "onerror=alert(3)" in text and "python train.py --name" in text
    assert "Description with <img src=x onerror=alert(3)>" in text and "# not a heading" in text
    assert "<b>x</b>|pipe*em*" in text  # a pipe and emphasis marks in a table cell stay text
    assert "not a number: <img" in text  # the log excerpt
    assert "<i>PASS</i>" in text and "<svg onload=alert(6)>" in text


def test_net_neutralizes_a_section_that_forgot(tmp_path: Path) -> None:
    """render()'s last check: raw HTML or a foreign link left by a careless section is escaped."""
    forgot = (
        f"## A new section\n\nreason: {XSS}\n\n<div onclick=x>\nblock\n</div>\n\n"
        "| a | b |\n|---|---|\n| <img src=y onerror=z> | [l](http://evil.example) |\n\n"
        "![chart](https://evil.example/t.png) `<script>` stays code\n\n![own](loss.png)\n"
    )
    assert live_html(forgot)
    fixed = mdformat.neutralize(forgot)
    assert live_html(fixed) == [] and mdformat.problems(fixed) == []
    assert "<script>" in "".join(html_of(fixed).text)  # the code span kept its text
    assert any(tag == "img" and attrs.get("src") == "loss.png" for tag, attrs in html_of(fixed).tags)
    assert mdformat.neutralize(fixed) == fixed  # clean markdown passes unchanged


# -- the helpers, for any text -------------------------------------------------

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=80) | st.from_regex(
    r"[ \t\n<>&\\`*_\[\]()!|#+=~:;'\"/a-z0-9.-]{0,60}", fullmatch=True
)
FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def shown(text: str) -> str:
    """What an inline rendering of ``text`` should read: breaks as spaces, ends stripped, NUL replaced."""
    return re.sub(r"\r\n|[\r\n\t\f\v]", " ", text).strip().replace("\0", "\ufffd")


@FUZZ
@given(TEXT)
def test_esc_makes_no_element(text: str) -> None:
    out = html_of(mdformat.esc(text))
    assert {tag for tag, _ in out.tags} <= {"p"}
    assert "".join(out.text).strip() == shown(text).strip()


@FUZZ
@given(TEXT, TEXT)
def test_escaped_text_inside_dstui_markup_stays_text(a: str, b: str) -> None:
    """Where sections put it: after a list marker, in bold, at a line's start after another line."""
    md = f"- Fastest: {mdformat.bold(a)} at 1 ms/step\n- {mdformat.esc(b)}\n\n{mdformat.esc(a)}\n{mdformat.esc(b)}\n"
    tags = {tag for tag, _ in html_of(md).tags}
    assert tags <= {"ul", "li", "strong", "p"}


@FUZZ
@given(TEXT)
def test_code_and_fence_hold_any_text(text: str) -> None:
    span = html_of(f"x {mdformat.code(text)} y")
    assert {tag for tag, _ in span.tags} <= {"p", "code"}
    block = html_of(f"{mdformat.fence(text)}\n\nafter\n")
    assert {tag for tag, _ in block.tags} <= {"pre", "code", "p"}
    body = text.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n").replace("\0", "\ufffd")
    assert "".join(block.text).startswith(body)


@FUZZ
@given(st.lists(TEXT, min_size=1, max_size=4))
def test_table_cells_hold_any_text(cells: list[str]) -> None:
    md = mdformat.table([f"h{i}" for i in range(len(cells))], [cells, [mdformat.code(c) for c in cells]])
    out = html_of(md)
    assert {tag for tag, _ in out.tags} <= {"table", "thead", "tbody", "tr", "th", "td", "code"}
    assert sum(tag == "td" for tag, _ in out.tags) == 2 * len(cells)  # a '|' or newline never splits a cell
