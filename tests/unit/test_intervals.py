"""Ratio intervals (dstui.analysis.intervals) with known inputs: coverage, positivity, small n, ratio near 1."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dstui.analysis.intervals import fieller_ratio


def _coverage(true_a: float, true_b: float, sd_a: float, sd_b: float, n: int, sims: int, seed: int) -> tuple[float, int]:
    rng = np.random.default_rng(seed)
    hits = bounded = 0
    ratio = true_a / true_b
    for _ in range(sims):
        a = rng.normal(true_a, sd_a, n)
        b = rng.normal(true_b, sd_b, n)
        ri = fieller_ratio(a.tolist(), b.tolist())
        if ri.bounded:
            bounded += 1
            hits += ri.low <= ratio <= ri.high  # type: ignore[operator]
    return hits / max(bounded, 1), bounded


@pytest.mark.parametrize(
    ("true_a", "true_b", "sd_a", "sd_b", "n"),
    [
        (0.090, 0.100, 0.004, 0.005, 5),  # 10% faster, 5 repeats
        (0.101, 0.100, 0.006, 0.003, 3),  # ratio near 1, unequal spread
        (0.120, 0.100, 0.005, 0.005, 2),  # two repeats: wide, still ~95%
    ],
)
def test_coverage_is_about_95_percent(true_a: float, true_b: float, sd_a: float, sd_b: float, n: int) -> None:
    cov, bounded = _coverage(true_a, true_b, sd_a, sd_b, n, sims=3000, seed=n)
    assert bounded > 2900  # a baseline clearly away from zero is almost always bounded
    # 3000 draws: the binomial standard error at 95% is 0.4%, so 93.5-96.5% is a tight check;
    # with 2 repeats the Welch-Satterthwaite df makes the interval conservative (never too narrow)
    assert 0.935 <= cov <= (0.99 if n == 2 else 0.965), cov


def test_old_method_negative_case_is_now_positive() -> None:
    """Two very noisy repeats, as in issue 14 ([-4.43, 7.27] before)."""
    a, b = [0.5, 2.5], [0.9, 1.1]
    ri = fieller_ratio(a, b)
    assert ri.ratio == pytest.approx(1.5)
    if ri.bounded:
        assert ri.low >= 0 and ri.low <= ri.ratio <= ri.high  # type: ignore[operator]
    else:
        assert "too noisy" in ri.note
    assert "few repeats" in ri.note or "too noisy" in ri.note


def test_positive_over_many_noisy_samples() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        a = np.abs(rng.normal(1.0, 0.4, 2)) + 0.01
        b = np.abs(rng.normal(1.0, 0.4, 2)) + 0.01
        ri = fieller_ratio(a.tolist(), b.tolist())
        assert ri.ratio is not None and ri.ratio > 0
        if ri.bounded:
            assert 0 <= ri.low <= ri.ratio <= ri.high  # type: ignore[operator]


def test_n1_has_no_interval_and_says_too_few_repeats() -> None:
    ri = fieller_ratio([0.11], [0.10, 0.101, 0.099])
    assert ri.ratio == pytest.approx(0.11 / 0.10)
    assert not ri.bounded
    assert ri.note.startswith("too few repeats (n=1 vs 3")
    assert ri.text() == f"{0.11 / 0.10:.3f} ({ri.note})"


def test_n2_warns_and_matches_independent_solution() -> None:
    a, b = [0.095, 0.099], [0.100, 0.104]
    ri = fieller_ratio(a, b)
    am, bm = np.mean(a), np.mean(b)
    va, vb = np.var(a, ddof=1) / 2, np.var(b, ddof=1) / 2
    r = am / bm
    df = (va + r**2 * vb) ** 2 / (va**2 + r**4 * vb**2)
    t = stats.t.ppf(0.975, df)
    lo, hi = sorted(np.roots([bm**2 - t**2 * vb, -2 * am * bm, am**2 - t**2 * va]).real)
    assert (ri.low, ri.high) == pytest.approx((lo, hi), rel=1e-9)
    assert ri.df == pytest.approx(df)
    assert "few repeats (n=2 vs 2)" in ri.note
    assert ri.text() == f"{r:.3f} [{lo:.3f}, {hi:.3f}]"


def test_ratio_near_one_interval_contains_one_and_is_tight() -> None:
    base = [0.1000, 0.1002, 0.0998, 0.1001, 0.0999]
    same = [0.1001, 0.0999, 0.1000, 0.1002, 0.0998]
    ri = fieller_ratio(same, base)
    assert ri.ratio == pytest.approx(1.0, abs=1e-3)
    assert ri.low < 1.0 < ri.high  # type: ignore[operator]
    assert ri.high - ri.low < 0.01  # type: ignore[operator]
    assert ri.note == ""


def test_no_spread_is_a_point() -> None:
    ri = fieller_ratio([0.2, 0.2, 0.2], [0.1, 0.1, 0.1])
    assert (ri.ratio, ri.low, ri.high) == pytest.approx((2.0, 2.0, 2.0))
    assert "no spread" in ri.note
