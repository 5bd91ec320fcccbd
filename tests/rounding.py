"""Tolerances for results that differ from a reference by float32 summation order only.

Splitting a batch over ranks (an all-reduce of per-rank means) or over
micro-batches (accumulated gradients) computes the same gradient as one
process on the whole batch, summed in another order. Each order rounds
differently, and training amplifies those roundings step after step by an
amount that depends on the run, and on how the CPU's kernels (AVX2, AVX-512,
AMX) block their sums. No fixed ``atol`` fits every machine.

So the tolerance is measured from the arithmetic itself, on the machine that
runs the test: the same training is run in float64 (the exact result, to
float32's eyes) and in float32 in several summation orders; how far those
float32 runs land from float64 is the rounding spread of this training here.
A result that differs by summation order only lies within a small multiple of
that spread, while a wrong result (a sum where a mean belongs, a lost step)
lies orders of magnitude outside it, which :func:`assert_within_rounding`
also checks, so the test can still fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

#: How many times the widest float32 order's distance from float64 a result
#: may be off. Rounding errors add like a random walk: the largest of a few
#: sampled orders times 8 covers an unsampled order with room to spare
#: (measured: 1.2 to 4.1 times the widest sampled order on the DDP and
#: accumulation tests), while a wrong result is 1e3 times or more outside.
SPREAD_FACTOR = 8.0

Run = Callable[[torch.dtype, Callable[[int], torch.Tensor]], Sequence[torch.Tensor]]


def flat(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """Every tensor, flattened and concatenated, in float64."""
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def identity_order(n: int) -> torch.Tensor:
    """Rows in their given order."""
    return torch.arange(n)


def reversed_order(n: int) -> torch.Tensor:
    """Rows last to first."""
    return torch.arange(n - 1, -1, -1)


def rotated_order(n: int) -> torch.Tensor:
    """Rows rotated by three places."""
    return torch.roll(torch.arange(n), 3)


def interleaved_order(n: int) -> torch.Tensor:
    """Even rows first, then odd rows (how two ranks split a batch)."""
    return torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)])


ORDERS = (identity_order, reversed_order, rotated_order, interleaved_order)


def rounding_spread(run: Run) -> tuple[torch.Tensor, float]:
    """The exact result and the float32 rounding spread of ``run``.

    Args:
        run: trains from scratch in the given dtype, permuting each batch's
            rows by the given order (a function of the batch size), and
            returns what the test compares (parameters, norms, ...).

    Returns:
        The float64 result (flattened) and the largest distance (max-abs) of
        a float32 run, over :data:`ORDERS`, from it.
    """
    exact = flat(run(torch.float64, identity_order))
    spread = max(float((flat(run(torch.float32, order)) - exact).abs().max()) for order in ORDERS)
    return exact, spread


def assert_within_rounding(
    got: Sequence[torch.Tensor], run: Run, start: Sequence[torch.Tensor] | None = None
) -> float:
    """Assert ``got`` equals ``run``'s result up to float32 summation order.

    Args:
        got: the result under test.
        run: the reference training, as for :func:`rounding_spread`.
        start: the values before training; when given, the bound must also be
            under a thousandth of how far training moved them, so a bound
            too loose to tell a wrong result is itself a failure.

    Returns:
        The bound used.
    """
    exact, spread = rounding_spread(run)
    bound = SPREAD_FACTOR * spread
    error = float((flat(got) - exact).abs().max())
    assert error <= bound, (
        f"{error:.3g} from the float64 result, over {SPREAD_FACTOR:g} x the float32 "
        f"rounding spread {spread:.3g}"
    )
    if start is not None:
        moved = float((exact - flat(start)).abs().max())
        assert bound < moved / 1000, f"bound {bound:.3g} cannot tell training ({moved:.3g})"
    return bound
