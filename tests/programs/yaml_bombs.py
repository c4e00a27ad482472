"""Hostile spec files (issue 40.5), for the tests and benchmarks/yaml_bombs.py alike."""

from __future__ import annotations

HEAD = "name: bomb\nsettings: {kind: command, command: [echo, hi], steps: 1, warmup_steps: 0}\n"
AXES = ("axes: {micro_batch: [" + ", ".join(map(str, range(1, 21))) + "], seq_length: ["
        + ", ".join(str(8 * i) for i in range(1, 21)) + "]}\nrepeats: 20\n")  # fmt: skip


def laughs(levels: int = 9, fan: int = 10) -> str:
    """The billion-laughs document: ``fan ** levels`` values from a few hundred bytes."""
    lines = ["a0: &a0 [" + ",".join(["lol"] * fan) + "]"]
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * fan) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def specs() -> dict[str, str]:
    """name -> spec text: each passes one limit of dstui.spec.bounded_yaml or of the expansion."""
    return {
        "billion laughs": HEAD + laughs(),
        "101 aliases": HEAD + "x: &x 1\n" + "".join(f"k{i}: *x\n" for i in range(101)),
        "nested 5000 deep (flow)": HEAD + "ds_overrides: " + "[" * 5000 + "]" * 5000 + "\n",
        "nested 1000 deep (block)": HEAD + "ds_overrides:\n" + "".join(f"{' ' * (i + 1)}k{i}:\n" for i in range(1000)),
        "8000 runs x 5 KB of settings": (HEAD + AXES).replace("[echo, hi]", "[echo, " + "x" * 5000 + "]"),
    }
