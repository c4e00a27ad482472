"""How long the credential scrubber and the terminal sanitiser take on one 10 MiB line (goal: under 1 s).

The scrubber (``dstui.core.secrets.strip_credentials``) reads every text file
of a run when it is uploaded (stdout.log included), so a long blob in a run's
output must cost time linear in its length. Each input is one line without a
newline. The goal holds for the blobs a run prints (letters and digits,
base64-like text, hex); the worst case of each rule (dashes, ``a://``, ``hf_``,
``--token x`` repeated: a match or a try at every few characters) is timed
too, to show it stays linear, not held to the goal.
``--old-kib N`` also times the pattern the URI rule had before (quadratic on
runs of letters and digits) on N KiB of letters, for comparison.

``dstui.core.terminal.printable`` (issue 40.4) is timed the same way: it runs on
every reason, log line and table cell a terminal gets, so on the blobs a run
prints, on text full of escape sequences (a colourised log), and on the worst
case of each pattern (an introducer repeated, a sequence that never ends).

    python benchmarks/scrubber.py [--mib 10] [--old-kib 16]
"""

from __future__ import annotations

import argparse
import base64
import random
import re
import string
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dstui.core.credential_text import MASK, strip_credentials  # noqa: E402
from dstui.core.terminal import printable  # noqa: E402

OLD_URI = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<cred>[^/@\s:]+(?::[^/@\s]*)?)@")


GOAL = ("letters+digits", "base64-like", "hex")


def inputs(size: int) -> dict[str, str]:
    rng = random.Random(0)
    return {
        "letters+digits": "".join(rng.choices(string.ascii_letters + string.digits, k=size)),
        "base64-like": base64.b64encode(rng.randbytes(size * 3 // 4)).decode()[:size],
        "hex": rng.randbytes(size // 2).hex(),
        "dashes": "-" * size,
        "'a://' repeated": ("a://" * (size // 4 + 1))[:size],
        "'hf_' repeated": ("hf_" * (size // 3 + 1))[:size],
        "'--token x ' repeated": ("--token x " * (size // 10 + 1))[:size],
        "'HF_TOKEN=x ' repeated": ("HF_TOKEN=x " * (size // 11 + 1))[:size],
        "'\"token\": \"x\", ' repeated": ('"token": "x", ' * (size // 14 + 1))[:size],
        "'Authorization: Bearer x ' repeated": ("Authorization: Bearer x " * (size // 24 + 1))[:size],
        "'a=' repeated": ("a=" * (size // 2 + 1))[:size],
    }


def terminal_inputs(size: int) -> dict[str, str]:
    rng = random.Random(1)
    colours = "".join(f"\x1b[{rng.randint(30, 37)}mword{i}\x1b[0m " for i in range(size // 16 + 1))[:size]
    return {
        "colourised log": colours,
        "'\\x1b[' repeated": ("\x1b[" * (size // 2 + 1))[:size],
        "'\\x1b]' repeated": ("\x1b]" * (size // 2 + 1))[:size],
        "CSI that never ends": "\x1b[" + "0" * (size - 2),
        "OSC that never ends": "\x1b]0;" + "t" * (size - 4),
        "a control every 2nd char": ("a\x07" * (size // 2 + 1))[:size],
    }


def timed(fn, text: str) -> float:  # noqa: ANN001 - a scrubber
    start = time.perf_counter()
    fn(text)
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=10.0, help="line length in MiB")
    p.add_argument("--old-kib", type=int, default=16, help="time the old URI pattern on this many KiB (0: skip)")
    args = p.parse_args()
    size = int(args.mib * 1024 * 1024)
    worst = 0.0
    print(f"strip_credentials on one {args.mib:g} MiB line:")
    for name, text in inputs(size).items():
        seconds = timed(strip_credentials, text)
        if name in GOAL:
            worst = max(worst, seconds)
        print(f"  {name:36s} {seconds:7.3f} s{'' if name in GOAL else '   (worst case of a rule)'}")
    print(f"slowest of {', '.join(GOAL)}: {worst:.3f} s (goal < 1 s): {'PASS' if worst < 1.0 else 'FAIL'}")
    print(f"printable (core.terminal) on one {args.mib:g} MiB line (and on a tenth of it: linear when ~10x less):")
    tenth = terminal_inputs(size // 10)
    for name, text in {**{k: v for k, v in inputs(size).items() if k in GOAL}, **terminal_inputs(size)}.items():
        seconds = timed(printable, text)
        goal = name in GOAL or name == "colourised log"
        if goal:
            worst = max(worst, seconds)
        small = f"   tenth: {timed(printable, tenth[name]):6.3f} s" if name in tenth else ""
        print(f"  {name:24s} {seconds:7.3f} s{small}{'' if goal else '   (worst case of a pattern)'}")
    print(f"slowest of the blobs and the colourised log: {worst:.3f} s (goal < 1 s): {'PASS' if worst < 1.0 else 'FAIL'}")
    if args.old_kib:
        letters = inputs(args.old_kib * 1024)["letters+digits"]
        old = timed(lambda t: OLD_URI.sub(lambda m: f"{m.group('scheme')}{MASK}@", t), letters)
        new = timed(strip_credentials, letters)
        print(f"old URI pattern on {args.old_kib} KiB of letters: {old:.3f} s (now {new:.4f} s)")
    return 0 if worst < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
