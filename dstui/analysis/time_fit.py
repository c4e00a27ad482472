"""Calibrating the time model on measured runs, and predicting with an honest uncertainty.

The prediction is ``t = sum_k exp(theta_k) * s_k``: the first-principles seconds
``s_k`` of each term (:mod:`dstui.analysis.time_model`) scaled by a factor per
term. The factors are fitted on measured step times in log space (a relative
error is what matters across configurations that differ 100x), pulled towards
1 by a prior as wide as the hardware guess is uncertain (``Hardware.spread``):
a term no measurement informs keeps its first-principles value, one that the
measurements pin down follows them. This is maximum a posteriori with a
Gaussian prior on ``theta``; the inverse of the Gauss-Newton Hessian at the
optimum is the factors' covariance, so a prediction comes with a standard
deviation (in log space) that is small near what was measured and large for a
configuration whose costly terms no run has exercised. The model's own error
(what no term describes) is estimated from the residuals and never taken
below ``MODEL_FLOOR``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dstui.analysis.time_model import TERMS, Hardware

MODEL_FLOOR = 0.02  # a model of step time is never trusted closer than 2% on a configuration it did not see
MEASUREMENT_FLOOR = 0.005


@dataclass(frozen=True)
class Observation:
    """One measured configuration: its terms, its mean step time and the relative noise of that mean."""

    terms: dict[str, float]
    seconds: float
    rel_sd: float = 0.02
    source: str = ""


@dataclass(frozen=True)
class Prediction:
    """A predicted step time and the standard deviation of its logarithm."""

    seconds: float
    log_sd: float
    source: str  # "prior" or "fit on N runs"

    def bound(self, z: float) -> float:
        """``exp(-z sd)`` times the prediction: the optimistic end at z standard deviations."""
        return self.seconds * math.exp(-z * self.log_sd)

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        return self.bound(z), self.bound(-z)

    def label(self) -> str:
        return seconds_label(self.seconds)


def seconds_label(seconds: float) -> str:
    """'12.3 ms', '1.23 s', '27.2 min': a step time for a table cell."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 1000 else f"{seconds / 60:.3g} min"


@dataclass
class TimeModel:
    """The calibrated model of one machine kind; :meth:`fit` after adding observations."""

    hardware: Hardware
    observations: list[Observation] = field(default_factory=list)
    theta: Any = None  # numpy array, one log factor per term
    cov: Any = None
    model_sd: float = MODEL_FLOOR

    @property
    def tau(self) -> float:
        return math.log(max(self.hardware.spread, 1.01))

    def fit(self) -> TimeModel:
        """Calibrate on the observations (none: the first-principles prior, with its full uncertainty)."""
        import numpy as np

        k = len(TERMS)
        if not self.observations:
            self.theta, self.cov = np.zeros(k), np.eye(k) * self.tau**2
            return self
        s = np.array([[o.terms.get(t, 0.0) for t in TERMS] for o in self.observations])
        y = np.log([o.seconds for o in self.observations])
        noise = np.array([max(o.rel_sd, MEASUREMENT_FLOOR) for o in self.observations])
        sd = np.sqrt(noise**2 + self.model_sd**2)
        theta = self._solve(s, y, sd, np.zeros(k))
        resid = np.log(s @ np.exp(theta)) - y
        jac = self._jacobian(s, theta, sd)
        cov = np.linalg.inv(jac.T @ jac)
        # the model's own error: residual scatter beyond what the fit's free directions absorb
        hat = float(np.trace(jac[: len(y)] @ cov @ jac[: len(y)].T))
        dof = max(1.0, len(y) - hat)
        self.model_sd = max(MODEL_FLOOR, math.sqrt(float(np.sum(resid**2)) / dof))
        sd = np.sqrt(noise**2 + self.model_sd**2)
        self.theta = self._solve(s, y, sd, theta)
        jac = self._jacobian(s, self.theta, sd)
        self.cov = np.linalg.inv(jac.T @ jac)
        return self

    def _solve(self, s: Any, y: Any, sd: Any, start: Any) -> Any:
        import numpy as np
        from scipy.optimize import least_squares

        tau = self.tau

        def residuals(theta: Any) -> Any:
            pred = s @ np.exp(theta)
            return np.concatenate([(np.log(np.maximum(pred, 1e-300)) - y) / sd, theta / tau])

        return least_squares(residuals, start, method="trf", x_scale=1.0).x

    def _jacobian(self, s: Any, theta: Any, sd: Any) -> Any:
        """d(residuals)/d(theta): each observation's term shares over its noise, then the prior's rows."""
        import numpy as np

        parts = s * np.exp(theta)
        shares = parts / np.maximum(parts.sum(axis=1, keepdims=True), 1e-300)
        return np.vstack([shares / sd[:, None], np.eye(len(theta)) / self.tau])

    def predict(self, terms: dict[str, float]) -> Prediction:
        """The step time of a configuration with these terms, and how sure the model is of it."""
        import numpy as np

        if self.theta is None:
            self.fit()
        s = np.array([terms.get(t, 0.0) for t in TERMS])
        parts = s * np.exp(self.theta)
        total = float(parts.sum())
        if total <= 0:
            return Prediction(0.0, math.inf, self.source)
        g = parts / total
        var = float(g @ self.cov @ g) + self.model_sd**2
        return Prediction(total, math.sqrt(var), self.source)

    @property
    def source(self) -> str:
        n = len(self.observations)
        return f"fit on {n} run{'s' if n != 1 else ''}" if n else "prior"

    def factors(self) -> dict[str, float]:
        """Each term's calibrated factor (1 = the first-principles guess)."""
        if self.theta is None:
            self.fit()
        return {t: math.exp(float(v)) for t, v in zip(TERMS, self.theta, strict=True)}


def fitted(hw: Hardware, observations: Sequence[Observation]) -> TimeModel:
    return TimeModel(hw, list(observations)).fit()
