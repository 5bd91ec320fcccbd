"""Low-rank factors of a matrix slot: the part its codes need not store.

A slot named in an optimizer's ``low_rank_slots`` keeps float32 factors
``P`` (orthonormal) and ``Q = M.T @ P`` beside its codes, which store only
the residual ``M - P @ Q.T`` (see :mod:`optiplug._state.codec`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from .blockwise import _hashed

__all__ = ["LOW_RANK", "START_ITERATIONS"]

LOW_RANK = 4
"""The rank of a low-rank slot's float32 factors. On the train job's default
config, int8 Muon with rank-4 factors ended -0.008, +0.001 and +0.001 nats
from fp32 on seeds 0 to 2, against +0.026, +0.010 and +0.015 without; ranks
2 and 8 did no better on seed 0 (simulated with an exact SVD)."""

START_ITERATIONS = 2
"""Subspace iterations of a low-rank slot's first factors (from hashed vectors);
each later write takes one, warm-started from the factors before it."""


def _factorable(shape: Sequence[int], rank: int) -> bool:
    """Whether a value of ``shape`` keeps factors of ``rank``: a matrix (first dimension by
    the rest) whose two sides both exceed ``rank``."""
    if rank <= 0 or len(shape) < 2:
        return False
    rows = shape[0]
    return rows > rank and math.prod(shape[1:]) > rank


def _matrix(value: torch.Tensor) -> torch.Tensor:
    """``value`` as a float32 matrix (its first dimension by the rest)."""
    return value.detach().float().reshape(value.shape[0], -1)


def _factors(matrix: torch.Tensor, previous: torch.Tensor | None, rank: int) -> torch.Tensor:
    """``(rows + cols, rank)`` factors of ``matrix``: ``P`` above ``Q = matrix.T @ P``.

    ``P`` is the orthonormal basis of ``matrix @ Q_previous`` (subspace
    iteration); without ``previous``, :data:`START_ITERATIONS` iterations from
    hashed vectors (the same on every device), and from those vectors too
    when ``Q_previous`` is all zero (the factors of a zero matrix), chosen on
    the device without a synchronisation. ``P @ Q.T`` is then the
    projection of ``matrix`` on ``P``'s span, whatever ``P`` is, so the
    residual the codes store is exact to their rounding. NaN and inf in the
    two thin products read as 0, so the factors stay finite (a non-finite
    element stays in the residual, its block's business as without them).
    Both products are taken transposed, ``(B.T @ M.T).T`` and ``(P.T @ M).T``,
    which reads ``M`` row by row: 1.7 and 3.5 times faster for a 768 x 3072
    matrix on a 2-core CPU.
    """
    rows, cols = matrix.shape
    start = _start_vectors(cols, rank, matrix.device)
    if previous is None:
        basis, iterations = start, START_ITERATIONS
    else:
        held = previous[rows:]
        basis, iterations = torch.where(held.abs().amax() > 0, held, start), 1
    for _ in range(iterations):
        projector = torch.linalg.qr(_finite((basis.T @ matrix.T).T)).Q
        basis = _finite((projector.T @ matrix).T)
    return torch.cat((projector, basis))


def _finite(thin: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(thin, nan=0.0, posinf=0.0, neginf=0.0)


@functools.cache
def _start_vectors(cols: int, rank: int, device: torch.device) -> torch.Tensor:
    """``(cols, rank)`` float32 vectors of hashed values, centred: the first subspace iteration's."""
    index = torch.arange(cols * rank, dtype=torch.int32, device=device)
    return _hashed(index, 0).view(cols, rank).float() - 32767.5


def _factored(
    value: torch.Tensor, previous: torch.Tensor | None, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``value``'s factors (:func:`_factors`, from ``previous``) and the residual the codes
    store, ``M - P @ Q.T`` as a matrix, ``value`` taken as a float32 matrix once for both."""
    matrix = _matrix(value)
    factors = _factors(matrix, previous, rank)
    rows = matrix.shape[0]
    return factors, torch.addmm(matrix, factors[:rows], factors[rows:].T, alpha=-1)
