"""Newton-Schulz coefficient schedules: Jordan's fixed quintic and Polar Express (torch-free).

Every iteration applies an odd quintic ``p(x) = a x + b x³ + c x⁵`` to the
singular values of the iterate (``X <- a X + (b A + c A²) X`` with
``A = X Xᵀ``). A *schedule* gives the ``(a, b, c)`` of each iteration:

- ``"quintic"``: Jordan's fixed ``(3.4445, -4.7750, 2.0315)`` every
  iteration (Jordan et al. 2024, "Muon: An optimizer for hidden layers in
  neural networks"), after dividing the input by its Frobenius norm. It
  plateaus with singular values spread over roughly (0.7, 1.2).
- ``"polar_express"``: the per-iteration minimax-optimal polynomials of
  Amsel, Persson, Musco and Gower, "The Polar Express: Optimal Matrix Sign
  Methods and Their Application to the Muon Algorithm" (arXiv 2505.16932),
  Algorithm 1: each ``p_t`` minimises the worst-case distance of the
  composition to ``sign(x)`` on ``[1e-3, 1]``. Two safety measures for low
  precision (their Section 4.4): every polynomial but the last is applied to
  ``x / 1.01`` (coefficients ``a/1.01, b/1.01³, c/1.01⁵``), and the input is
  divided by ``1.01 * ||X||_F`` so that rounding cannot push a singular value
  above 1. Iterations past the table repeat its last polynomial
  ``(15x - 10x³ + 3x⁵) / 8`` (the classical quintic Newton-Schulz, to which
  the optimal polynomials converge).

A tuple ``(a, b, c)`` is a fixed schedule, as before.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "NS_COEFFICIENTS",
    "POLAR_EXPRESS",
    "POLAR_EXPRESS_SAFETY",
    "QUINTIC",
    "Coefficients",
    "coefficient_schedule",
    "input_scale",
]

Coefficients = tuple[float, float, float]

QUINTIC: Coefficients = (3.4445, -4.7750, 2.0315)
"""Jordan's quintic: maximal slope at zero with singular values kept in about (0.7, 1.2)."""

_POLAR_EXPRESS_TABLE: tuple[Coefficients, ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
"""Polar Express, degree 5, lower bound 1e-3 (arXiv 2505.16932, Algorithm 1), before the safety factor."""

POLAR_EXPRESS_SAFETY = 1.01
"""Safety factor of arXiv 2505.16932 (Section 4.4): input and polynomials scaled by 1/1.01."""


def _safe(abc: Coefficients, factor: float) -> Coefficients:
    """``p(x / factor)``: ``(a / f, b / f³, c / f⁵)``."""
    a, b, c = abc
    return (a / factor, b / factor**3, c / factor**5)


POLAR_EXPRESS: tuple[Coefficients, ...] = (
    *(_safe(abc, POLAR_EXPRESS_SAFETY) for abc in _POLAR_EXPRESS_TABLE[:-1]),
    _POLAR_EXPRESS_TABLE[-1],
)
"""The Polar Express schedule as run: safety factor on every polynomial but the last."""

NS_COEFFICIENTS = ("quintic", "polar_express")
"""Names ``ns_coefficients`` accepts besides a tuple ``(a, b, c)``."""


def coefficient_schedule(coefficients: Any, steps: int) -> tuple[Coefficients, ...]:
    """The ``(a, b, c)`` of each of ``steps`` iterations.

    Args:
        coefficients: ``"quintic"``, ``"polar_express"`` or a tuple ``(a, b, c)``
            (validated by :class:`~optiplug_muon.config.MuonConfig`).
        steps: Newton-Schulz iterations.

    Returns:
        ``steps`` coefficient triples.
    """
    if coefficients == "polar_express":
        table = POLAR_EXPRESS[:steps]
        return table + (POLAR_EXPRESS[-1],) * (steps - len(table))
    fixed = QUINTIC if coefficients == "quintic" else tuple(float(v) for v in coefficients)
    return (fixed,) * steps  # type: ignore[return-value]


def input_scale(coefficients: Any) -> float:
    """What the Frobenius norm is multiplied by before dividing the input by it.

    Args:
        coefficients: as for :func:`coefficient_schedule`.

    Returns:
        :data:`POLAR_EXPRESS_SAFETY` for ``"polar_express"``, else 1.
    """
    return POLAR_EXPRESS_SAFETY if coefficients == "polar_express" else 1.0
