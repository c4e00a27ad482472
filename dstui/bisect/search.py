"""Which commit to test next, and what the verdicts so far conclude (pure: no I/O).

The candidates are the commits after the good one, oldest first; index
``len(candidates)`` stands for "no regression". With the good commit as the
baseline, the answer is one of ``n + 1`` outcomes, so a halving search needs at
most ``ceil(log2(n + 1))`` tests: the bad end is never tested first for its own
sake, only when the halving reaches it (that test is what tells a regression
from none). A skipped commit (does not build, crashes, undecided) is stepped
around by testing its nearest untested neighbour, as ``git bisect skip`` does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass(frozen=True)
class Conclusion:
    """Where the search stands: the range still open and, once closed, the answer.

    ``first_bad`` is the index of the first bad commit, ``n`` (the number of
    candidates) when there is no regression, None while open or ambiguous.
    ``suspects`` lists the indexes it can still be when skips leave it ambiguous.
    """

    lo: int
    hi: int
    done: bool
    first_bad: int | None = None
    suspects: list[int] = field(default_factory=list)

    def left(self) -> int:
        """Outcomes still possible (commits in range, plus "none" while the bad end is unproven)."""
        return self.hi - self.lo + 1


def bounds(n: int, verdicts: Mapping[int, str]) -> tuple[int, int]:
    """[lo, hi]: the first bad commit is at an index in this range (hi == n: maybe none).

    lo is past the newest good commit; hi is the oldest bad commit above lo. A
    bad commit below a good one (a non-monotonic history) is ignored, the way
    git bisect trusts the newest good mark.
    """
    lo = max((i + 1 for i, v in verdicts.items() if v == GOOD), default=0)
    hi = min((i for i, v in verdicts.items() if v == BAD and i >= lo), default=n)
    return lo, hi


def conclude(n: int, verdicts: Mapping[int, str]) -> Conclusion:
    lo, hi = bounds(n, verdicts)
    if lo == hi:
        return Conclusion(lo, hi, True, first_bad=hi)
    open_ = [i for i in range(lo, hi) if i not in verdicts]
    if open_:
        return Conclusion(lo, hi, False)
    # Only skipped commits are left below hi: the culprit is one of them or hi itself.
    suspects = [i for i in range(lo, hi) if verdicts.get(i) == SKIP] + ([hi] if hi < n else [])
    return Conclusion(lo, hi, True, first_bad=None, suspects=suspects)


def next_index(n: int, verdicts: Mapping[int, str]) -> int | None:
    """The commit to test next: the middle of the open range, or its nearest untested neighbour."""
    c = conclude(n, verdicts)
    if c.done:
        return None
    mid = (c.lo + c.hi) // 2
    open_ = [i for i in range(c.lo, c.hi) if i not in verdicts]
    return min(open_, key=lambda i: (abs(i - mid), i))


def tests_left(c: Conclusion) -> int:
    """About how many more tests the halving needs: log2 of the outcomes still open (skips add to it)."""
    return 0 if c.done else max(1, math.ceil(math.log2(c.left())))


def path(n: int, verdicts: Mapping[int, str]) -> list[int]:
    """The indexes the search visits, in order, replayed from the verdicts (the search keeps no log of its own).

    The search is a function of the verdicts, so replaying it shows the order in
    which a bisect tested its commits; it stops at the first index not yet decided.
    """
    seen: dict[int, str] = {}
    order = []
    while (i := next_index(n, seen)) is not None and i in verdicts:
        order.append(i)
        seen[i] = verdicts[i]
    return order
