"""A rank's death names the rank and its signal with more than two ranks (issue 20).

Real DeepSpeed, 3 gloo ranks on the CPU; rank 2 (neither the first nor, with
DeepSpeed's own launcher, the one its log line would name by accident) is
killed from outside while training. The others then fail over the lost peer.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest
import yaml
from helpers import SPECS, dstui, mlflow_client

from dstui.core.rundir import list_batches


def _wait(pred, timeout: float, what: str):
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(
    ("sig", "expected"),
    [(signal.SIGSEGV, "rank 2: SIGSEGV in "), (signal.SIGKILL, "rank 2: SIGKILL (killed from outside")],
    ids=["segv", "kill"],
)
def test_rank_two_of_three_dies_and_is_named(home: Path, sig: signal.Signals, expected: str) -> None:
    data = yaml.safe_load((SPECS / "smoke.yaml").read_text())
    data.update(name="three-ranks", axes={"zero_stage": [2]})
    data.pop("baseline")  # one condition ('base'): smoke's z0 is not among them
    data["settings"].update(steps=400, warmup_steps=1, gpus=3)
    spec = home / "three.yaml"
    spec.write_text(yaml.safe_dump(data))
    dstui("run", "--detach", str(spec), check=True)
    b = _wait(lambda: (list_batches(home / "runs") or [None])[0], 60, "a batch")
    rd = _wait(lambda: b.runs() and b.runs()[0], 60, "a run")
    _wait(lambda: (rd.status().get("steps_done") or 0) >= 2, 600, "training steps")
    ranks = {r: [p for p in psutil.process_iter(["cmdline"]) if f"--local_rank={r}" in " ".join(p.info["cmdline"] or [])
                 and str(rd.metrics_file) in " ".join(p.info["cmdline"] or [])] for r in range(3)}  # fmt: skip
    assert all(len(ps) == 1 for ps in ranks.values()), ranks
    ranks[2][0].send_signal(sig)
    _wait(lambda: b.info().get("finalized"), 300, "batch finalized")
    st = rd.status()
    print(f"reason: {st['reason']}")
    assert st["state"] == "failed" and st["reason"].startswith(expected), (st["reason"], rd.log_file.read_text()[-3000:])
    assert mlflow_client().get_run(st["mlflow_run_id"]).data.tags["dstui.reason"] == st["reason"]
    assert f"dstui ranks: rank 2 failed ({sig.name})" in rd.log_file.read_text()
    with pytest.raises(ProcessLookupError):
        os.killpg(st["pgid"], 0)
    left = [p for p in psutil.process_iter(["cmdline"]) if str(rd.metrics_file) in " ".join(p.info["cmdline"] or [])]
    assert left == []
