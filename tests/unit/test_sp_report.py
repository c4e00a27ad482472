"""The report's sequence-parallel section over a real MLflow store: each mode beside its no-SP run, with the verdict's evidence."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_report import BATCH, EXP, STEPS, log_run, make_parent, store  # noqa: F401

from dstui.analysis.sequence_parallel import NoSp, SpRow
from dstui.report import mdformat
from dstui.report.sections.sequence_parallel import section
from dstui.usecases.report import export_report

GIB = 1024**3
HOSTILE = "tensors differ | <img src=x onerror=alert(1)> [click](http://evil.example) `x`"


def _summary_artifact(client: Any, rid: str, **fields: Any) -> None:
    client.log_text(rid, json.dumps({"type": "summary", "check": "sp-check", **fields}) + "\n", "run/metrics.jsonl")


def _sp_run(client: Any, exp_id: str, parent: str, condition: str, params: dict, *, verdict: str, step_s: float,
            peak_gib: float, metrics: dict | None = None) -> str:  # fmt: skip
    rid = log_run(client, exp_id, parent, condition=condition,
                  params={"sequence_parallel": 2, "sp_check": True, "zero_stage": 1, **params},
                  tags={"dstui.verdict": verdict}, metrics=metrics,
                  history={"iter_time": [(s, step_s) for s in STEPS], "mem_peak": [(s, peak_gib * GIB) for s in STEPS]})  # fmt: skip
    return rid


def test_each_mode_beside_its_no_sp_run_with_the_evidence(store: tuple[Any, str, str], tmp_path: Path) -> None:  # noqa: F811
    client, exp_id, _ = store
    parent = make_parent(client, exp_id, BATCH)
    log_run(client, exp_id, parent, condition="nosp", params={"zero_stage": 1},
            history={"iter_time": [(s, 0.2) for s in STEPS], "mem_peak": [(s, 4 * GIB) for s in STEPS]})  # fmt: skip
    check_nosp = {"summary.nosp_iter_time_mean": 0.5, "summary.nosp_tokens_per_s_mean": 256.0,
                  "summary.nosp_mem_peak_max": 8 * GIB}  # fmt: skip
    eager = _sp_run(client, exp_id, parent, "u-eager", {"sp_mode": "eager"}, verdict="PASS", step_s=0.3, peak_gib=3,
                    metrics={"summary.margin": 130.0, "summary.tensor_max_rel": 2e-7, "summary.tensor_margin": 50.0,
                             **check_nosp})  # fmt: skip
    _summary_artifact(client, eager, verdict="PASS")
    ring = _sp_run(client, exp_id, parent, "ring-z3", {"sp_mode": "ring", "zero_stage": 3}, verdict="PASS",
                   step_s=0.4, peak_gib=2, metrics={"summary.margin": 60.0, **check_nosp})  # fmt: skip
    _summary_artifact(client, ring, verdict="PASS")
    bad = _sp_run(client, exp_id, parent, "u-split", {"sp_mode": "eager"}, verdict="FAIL", step_s=0.3, peak_gib=3)
    _summary_artifact(client, bad, verdict="FAIL", reason=HOSTILE)
    md = export_report(EXP, tmp_path / "r").read_text()
    assert "## Sequence parallelism" in md and "2 of 3 checked runs PASS" in md
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in md.splitlines() if line.startswith("| `")}
    # beside the measured no-SP condition (same model, sequence, ranks, ZeRO stage, eager): 0.3 s vs 0.2 s
    # tokens/s: 2 x 64 tokens a step over one SP group against 2 groups' worth without SP
    assert "| Ulysses eager | 2 x 1 | 1 | 64 | 300.0 ms (1.50x) | 426.7 (0.33x) | 3.0GiB (0.75x) | 200.0 ms | 1,280 |" \
        in rows["`u-eager-r0`"]
    assert "| run nosp-r0 | **PASS** |" in rows["`u-eager-r0`"]
    assert "loss margin 130; tensors: largest relative difference 2e-07 (margin 50)" in rows["`u-eager-r0`"]
    # ZeRO-3 has no measured no-SP twin here: the check's own no-SP run, 0.4 s vs 0.5 s
    assert "| ring attention | 2 x 1 | 3 | 64 | 400.0 ms (0.80x) |" in rows["`ring-z3-r0`"]
    assert "| 500.0 ms | 256.0 | 8.0GiB | sp-check's no-SP run | **PASS** | loss margin 60 |" in rows["`ring-z3-r0`"]
    # the failure's reason, as text: no live HTML, no link, no extra table cell
    line = rows["`u-split-r0`"]
    assert "**FAIL**" in line and not re.search(r"(?<!\\)<", line) and "\\[click\\](http" in line
    assert len(re.findall(r"(?<!\\)\|", line)) == 16  # 15 cells


@settings(max_examples=60, deadline=None)
@given(name=st.text(max_size=40), label=st.text(max_size=40), evidence=st.text(max_size=300))
def test_untrusted_text_stays_text_in_the_table(name: str, label: str, evidence: str) -> None:
    row = SpRow(run_name=name, label=label, mode="ring attention", sp=2, dp=1, zero=label, seq_length=name,
                iter_time=0.1, tokens_per_s=100.0, mem_peak=None, verdict="FAIL", evidence=evidence,
                nosp=NoSp(label, None, 5.0, None))  # fmt: skip
    md = section([row])
    table = [ln for ln in md.split("\n") if ln.startswith("|")]  # a Markdown line ends at a newline only
    assert len(table) == 3  # head, rule, one row: nothing broke out of its line
    assert all(len(re.findall(r"(?<!\\)\|", ln)) == 16 for ln in table)
    assert mdformat.neutralize(md) == md  # no live HTML, no foreign link
