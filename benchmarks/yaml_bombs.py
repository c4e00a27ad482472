"""How long dstui takes to refuse a hostile spec (issue 40.5; goal: under 1 s each).

Each spec of tests/programs/yaml_bombs.py is written to a file and read as `dstui
run` and `dstui list` read it (``load_spec``: size check, bounded YAML, the spec's
models and names, the expansion's footprint) until it is refused; the best of
``--repeats`` in-process timings is printed, with the line the user sees and the
number of values the document stands for once its aliases are expanded (what the
old reader handed on: the billion laughs is 10**9, built as shared references,
then copied run after run).

    python benchmarks/yaml_bombs.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "programs"))

from yaml_bombs import specs  # noqa: E402

from dstui.core.errors import SpecError  # noqa: E402
from dstui.spec.loading import load_spec  # noqa: E402

GOAL_S = 1.0


def expanded_values(text: str) -> int | None:
    """Values the document stands for with every alias expanded (PyYAML's node graph, memoised); None when unreadable."""
    sys.setrecursionlimit(20000)
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        if id(node) not in sizes:
            children = [c for kv in node.value for c in kv] if isinstance(node, yaml.MappingNode) else node.value
            sizes[id(node)] = 1 + (sum(size(c) for c in children) if isinstance(children, list) else 0)
        return sizes[id(node)]

    try:
        return size(yaml.compose(text))
    except (yaml.YAMLError, RecursionError):
        return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in specs().items():
            path = Path(tmp) / "bomb.yaml"
            path.write_text(text)
            best, line = float("inf"), ""
            for _ in range(args.repeats):
                start = time.perf_counter()
                try:
                    load_spec(path)
                    line = "ACCEPTED"
                except SpecError as e:
                    line = str(e).replace(str(path), "bomb.yaml")
                best = min(best, time.perf_counter() - start)
            worst = max(worst, best)
            values = expanded_values(text)
            shown = f"{values:,}" if values is not None else "(PyYAML fails: too deep)"
            print(f"{name:30s} {len(text):>9,} B  stands for {shown:>26s} values  refused in {best * 1000:7.1f} ms")
            print(f"{'':30s} {line}")
    print(f"slowest refusal {worst * 1000:.1f} ms (goal < {GOAL_S * 1000:.0f} ms): {'PASS' if worst < GOAL_S else 'FAIL'}")
    return 0 if worst < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
