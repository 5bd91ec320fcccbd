"""The statistics of a race: Student's t distribution, confidence intervals, Welch's t-test.

Pure Python (no scipy, no torch). The t distribution's CDF goes through the
regularized incomplete beta function, evaluated with its continued fraction
by the modified Lentz method (Press et al., *Numerical Recipes*, 3rd ed.,
section 6.4): for ``T`` with ``df`` degrees of freedom,
``P(|T| > t) = I_x(df/2, 1/2)`` with ``x = df / (df + t**2)``, or
``1 - I_{1-x}(1/2, df/2)`` for small ``t``, where ``1 - x`` is the accurate one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from optiplug.errors import OptiplugError

__all__ = [
    "StatisticsError",
    "Welch",
    "mean_interval",
    "regularized_beta",
    "t_cdf",
    "t_quantile",
    "two_sided_p",
    "welch",
]

_EPS = 1e-15  # relative size of the continued fraction's last factor: double precision
_TINY = 1e-300  # stands in for a zero denominator (Lentz's method)
_MAX_TERMS = 10_000


class StatisticsError(OptiplugError, ValueError):
    """A statistic asked of data or arguments that cannot give it (too few values, df <= 0)."""


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)``, by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    fraction = d
    for m in range(1, _MAX_TERMS + 1):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),  # the even term d_{2m}
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),  # the odd d_{2m+1}
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            fraction *= c * d
        if abs(c * d - 1.0) < _EPS:
            return fraction
    raise StatisticsError(f"the incomplete beta I_{x}({a}, {b}) did not converge")


def regularized_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``.

    Args:
        x: where, in [0, 1].
        a: first shape parameter, > 0.
        b: second shape parameter, > 0.

    Returns:
        ``I_x(a, b)``, in [0, 1].

    Raises:
        StatisticsError: ``x`` outside [0, 1] or a shape parameter <= 0.
    """
    if not (a > 0 and b > 0):
        raise StatisticsError(f"regularized_beta: a and b must be > 0, got a={a!r}, b={b!r}")
    if not 0.0 <= x <= 1.0:
        raise StatisticsError(f"regularized_beta: x must be in [0, 1], got {x!r}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast here; else use symmetry
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _check_df(df: float) -> None:
    if not df > 0:
        raise StatisticsError(f"degrees of freedom must be > 0, got {df!r}")


def two_sided_p(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student's ``T`` with ``df`` degrees of freedom.

    Args:
        t: the statistic (``±inf`` gives 0).
        df: degrees of freedom, > 0 (need not be an integer).

    Returns:
        The two-sided tail probability.

    Raises:
        StatisticsError: ``df <= 0`` or ``t`` is NaN.
    """
    _check_df(df)
    if math.isnan(t):
        raise StatisticsError("two_sided_p: t is NaN")
    if math.isinf(t):
        return 0.0
    square = t * t
    if square < df:  # x = df / (df + t²) is near 1: use 1 - x = t² / (df + t²), exact to an ulp
        return 1.0 - regularized_beta(square / (df + square), 0.5, df / 2.0)
    return regularized_beta(df / (df + square), df / 2.0, 0.5)


def t_cdf(t: float, df: float) -> float:
    """Student's t cumulative distribution function ``P(T <= t)``.

    Args:
        t: where.
        df: degrees of freedom, > 0.

    Returns:
        The probability.

    Raises:
        StatisticsError: ``df <= 0`` or ``t`` is NaN.
    """
    tail = 0.5 * two_sided_p(t, df)
    return 1.0 - tail if t > 0 else tail


def t_quantile(probability: float, df: float) -> float:
    """The ``t`` with ``P(T <= t) = probability``: bisection on :func:`t_cdf`.

    Args:
        probability: in (0, 1).
        df: degrees of freedom, > 0.

    Returns:
        The quantile (``t_quantile(0.975, 1)`` is 12.706).

    Raises:
        StatisticsError: ``probability`` outside (0, 1) or ``df <= 0``.
    """
    _check_df(df)
    if not 0.0 < probability < 1.0:
        raise StatisticsError(f"t_quantile: probability must be in (0, 1), got {probability!r}")
    if probability < 0.5:
        return -t_quantile(1.0 - probability, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < probability:
        low, high = high, 2.0 * high
    for _ in range(200):  # each halves the bracket; 200 reach the spacing of doubles
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        low, high = (middle, high) if t_cdf(middle, df) < probability else (low, middle)
    return 0.5 * (low + high)


def _mean_variance(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the unbiased (n - 1) variance; needs at least two values."""
    mean = math.fsum(values) / len(values)
    return mean, math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)


def mean_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its Student-t confidence interval.

    The interval is ``mean ± t_{(1 + level)/2, n-1} * s / sqrt(n)``, ``s`` the
    sample standard deviation.

    Args:
        values: the measurements (one per seed).
        level: the confidence level, in (0, 1).

    Returns:
        ``(mean, half_width)``; the half-width is NaN for a single value.

    Raises:
        StatisticsError: no values, or ``level`` outside (0, 1).
    """
    if not values:
        raise StatisticsError("mean_interval: no values")
    if not 0.0 < level < 1.0:
        raise StatisticsError(f"mean_interval: level must be in (0, 1), got {level!r}")
    if len(values) < 2:
        return float(values[0]), math.nan
    mean, variance = _mean_variance(values)
    n = len(values)
    return mean, t_quantile((1.0 + level) / 2.0, n - 1) * math.sqrt(variance / n)


@attrs.frozen
class Welch:
    """Welch's unequal-variances t-test of two samples.

    Attributes:
        t: ``(mean(a) - mean(b)) / sqrt(s_a²/n_a + s_b²/n_b)``.
        df: the Welch-Satterthwaite degrees of freedom.
        p: the two-sided p-value.
    """

    t: float
    df: float
    p: float


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's t-test, two-sided: do ``a`` and ``b`` have the same mean?

    The degrees of freedom are Welch-Satterthwaite's,
    ``(v_a + v_b)² / (v_a²/(n_a - 1) + v_b²/(n_b - 1))`` with ``v = s²/n``.
    When both samples are constant the test is degenerate: ``p`` is 1 for
    equal means and 0 for different ones (``df`` is then NaN).

    Args:
        a: the first sample (at least two values).
        b: the second sample (at least two values).

    Returns:
        The statistic, the degrees of freedom and the p-value.

    Raises:
        StatisticsError: a sample with fewer than two values.
    """
    if len(a) < 2 or len(b) < 2:
        raise StatisticsError(
            f"welch: each sample needs at least two values, got {len(a)} and {len(b)}"
        )
    mean_a, var_a = _mean_variance(a)
    mean_b, var_b = _mean_variance(b)
    v_a, v_b = var_a / len(a), var_b / len(b)
    if v_a + v_b == 0.0:
        same = mean_a == mean_b
        t = 0.0 if same else math.copysign(math.inf, mean_a - mean_b)
        return Welch(t=t, df=math.nan, p=1.0 if same else 0.0)
    t = (mean_a - mean_b) / math.sqrt(v_a + v_b)
    df = (v_a + v_b) ** 2 / (v_a**2 / (len(a) - 1) + v_b**2 / (len(b) - 1))
    return Welch(t=t, df=df, p=two_sided_p(t, df))
