"""Newton-Schulz orthogonalisation: the standard iteration and its Gram form.

For a batch ``X`` of ``B`` matrices of one shape, each is divided by its
Frobenius norm (floored at ``eps``) and then iterated ``steps`` times. With
``A`` the small Gram matrix (``X Xᵀ`` for a wide matrix, ``Xᵀ X`` for a tall
one, so ``k x k`` with k the smaller side) and ``P = b A + c A²``::

    standard:  X <- a X + P X      (wide; tall: a X + X P)

``(a, b, c)`` may change from one iteration to the next
(``coefficients="polar_express"``, arXiv 2505.16932; the schedules are in
:mod:`optiplug_muon.coefficients`); every form below takes the schedule.

The **Gram** form (Newton-Schulz iterated on ``A`` instead of ``X``; see
docs/optimizers/muon.md) is the same iteration in exact arithmetic: with
``M = a I + P``, ``X' = M X`` and ``A' = M A M``, so the ``k x k`` matrices can
be updated without touching ``X``, and the product ``Q`` of the ``M`` is
applied to ``X`` once. In bf16, ``A`` drifts from ``X' X'ᵀ``; the iteration
therefore restarts (``X <- Q X``, ``A <- X Xᵀ``) every :data:`RESTART_EVERY`
iterations, which keeps its error at that of the standard form. It needs
fewer multiplications when the matrix is clearly rectangular;
:func:`resolve_method` picks the cheaper one.

Every product whose result is symmetric (Gram matrices, polynomials of them)
is computed on CPU, one matrix at a time, as :data:`SYMMETRIC_BLOCKS` block
rows of its lower triangle and mirrored, which skips a third of its
multiply-adds (see :func:`symmetric_blocks`). All
products are ``mm``/``addmm`` (one matrix) or ``bmm``/``baddbmm`` (a batch)
writing into preallocated buffers: without reuse, a batched allocation above
glibc's mmap threshold (32 MiB) is returned to the OS and page-faulted back in
on every call.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

import attrs
import torch
from torch import Tensor

from optiplug.errors import HyperparameterError

from .coefficients import NS_COEFFICIENTS, QUINTIC, coefficient_schedule, input_scale
from .config import NS_METHODS, MuonConfig

__all__ = [
    "RESTART_EVERY",
    "SYMMETRIC_BLOCKS",
    "Buffers",
    "Workspace",
    "allocate_buffers",
    "check_coefficients",
    "check_method",
    "default_ns_dtype",
    "method_flops",
    "newton_schulz_",
    "orthogonalize",
    "resolve_method",
    "symmetric_blocks",
]

RESTART_EVERY = 2
"""Gram form: recompute ``X`` and ``A = X Xᵀ`` after this many iterations.

Measured in bf16 on a 768x2304 input against the float64 iteration (relative
error; standard form / every 2 / every 3 / never): Gaussian 0.0107 / 0.0123 /
0.0166 / 0.0120; rank 16 plus noise 0.206 / 0.174 / 0.170 / 2.16; singular
values log-spaced from 1 to 1e-4 0.058 / 0.053 / 0.050 / 0.404."""

SYMMETRIC_BLOCKS = 3
"""Block rows of a symmetric product computed on CPU (2/3 of the multiply-adds).

On GPT-2 small's matrices a Muon step took 1.51 s with 2 blocks, 1.46 s with
3, 1.52 s with 4 and 1.71 s with 8 (smaller products run further from peak,
and each block row adds a transposed copy)."""

_MIN_BLOCKED = 256
_SQUARES = {"standard": 2, "gram": 5}


_NS_DTYPES: dict[str, torch.dtype] = {}
"""Probed default Newton-Schulz dtype per device type (see :func:`default_ns_dtype`)."""


def default_ns_dtype(device_type: str) -> torch.dtype:
    """bfloat16 where the device multiplies bf16 matrices fast, else float32.

    CUDA: devices with native bf16 (``torch.cuda.is_bf16_supported()``). CPU:
    those with AVX512-BF16 or AMX tiles, where oneDNN's bf16 matmul runs
    about 4x faster than fp32 (measured 4.6 ms vs 18.4 ms for a
    768x3072 @ 3072x768 product on a 2-core AMD EPYC with AVX512-BF16).
    Elsewhere bf16 matmul is emulated and slower, so float32.

    The answer is probed once per device type and kept in a plain dict:
    ``Muon`` probes its parameters' devices when it is built, so a
    ``torch.compile``-d step only reads the dict (which dynamo traces as a
    constant), never the capability checks (which it cannot trace).

    Args:
        device_type: ``"cpu"``, ``"cuda"``...

    Returns:
        The dtype Newton-Schulz runs in when ``ns_dtype`` is None.
    """
    found = _NS_DTYPES.get(device_type)
    if found is None:
        found = _NS_DTYPES.setdefault(device_type, _probe_ns_dtype(device_type))
    return found


def _probe_ns_dtype(device_type: str) -> torch.dtype:
    if device_type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device_type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        fast = any(getattr(torch.cpu, check, lambda: False)() for check in checks)
        return torch.bfloat16 if fast else torch.float32
    return torch.float32


def symmetric_blocks(device_type: str, size: int, batch: int) -> int:
    """Block rows used for a symmetric ``size x size`` product.

    On CPU, one matrix at a time (``mm``), the products are compute-bound and
    block rows of 85 or more keep oneDNN near its peak, so skipping the upper
    triangle pays. Batched (``bmm``) products of strided blocks make oneDNN
    copy its operands, which costs more than it saves (measured: a GPT-2-small
    step took 1.77 s blocked against 1.56 s unblocked), and other devices are
    not measured here, so they keep one full product.

    Args:
        device_type: ``"cpu"``, ``"cuda"``...
        size: the side of the product.
        batch: matrices multiplied together.

    Returns:
        :data:`SYMMETRIC_BLOCKS` on CPU for single matrices of side 256 or more, else 1.
    """
    blocked = device_type == "cpu" and batch == 1 and size >= _MIN_BLOCKED
    return SYMMETRIC_BLOCKS if blocked else 1


def _gram_schedule(steps: int) -> Iterator[tuple[bool, bool, bool]]:
    """Per Gram-form iteration: (``Q`` is the identity, restart after it, last)."""
    fresh = True
    for step in range(steps):
        last = step == steps - 1
        restart = not last and (step + 1) % RESTART_EVERY == 0
        yield fresh, restart, last
        fresh = restart


def method_flops(method: str, rows: int, cols: int, steps: int, blocks: int) -> float:
    """Multiply-adds (x2) of one orthogonalisation by ``method`` ("standard" or "gram").

    Args:
        method: ``"standard"`` or ``"gram"``.
        rows: matrix rows.
        cols: matrix columns.
        steps: Newton-Schulz iterations.
        blocks: block rows of symmetric products (see :func:`symmetric_blocks`).

    Returns:
        Floating-point operations of the matrix products.
    """
    k, n = min(rows, cols), max(rows, cols)
    sym = (blocks + 1) / (2 * blocks)
    gram, square, rect = sym * 2 * k * k * n, sym * 2 * k**3, 2 * k * k * n
    if method == "standard":
        return steps * (gram + square + rect)
    total = gram
    for fresh, restart, last in _gram_schedule(steps):
        total += square  # P
        if last:
            total += rect + (0 if fresh else square)
        else:
            total += (0 if fresh else square) + (rect + gram if restart else 2 * square)
    return total


def check_method(method: object) -> None:
    """Raise unless ``method`` is one of :data:`~optiplug_muon.config.NS_METHODS`.

    Raises:
        HyperparameterError: naming ``ns_method`` and the value.
    """
    if method not in NS_METHODS:
        choices = " | ".join(NS_METHODS)
        raise HyperparameterError("ns_method", method, f"must be {choices}", algorithm="muon")


def resolve_method(
    method: str, rows: int, cols: int, steps: int, device_type: str, batch: int
) -> str:
    """``"standard"`` or ``"gram"``: as given, or for ``"auto"`` whichever needs fewer FLOPs.

    Args:
        method: one of :data:`~optiplug_muon.config.NS_METHODS`.
        rows: matrix rows.
        cols: matrix columns.
        steps: Newton-Schulz iterations.
        device_type: where it runs (with ``batch``, decides symmetric blocking).
        batch: matrices orthogonalised together.

    Returns:
        The method to run.

    Raises:
        HyperparameterError: ``method`` is not one of the names (e.g. a param
            group edited after construction).
    """
    check_method(method)
    if method != "auto":
        return method
    blocks = symmetric_blocks(device_type, min(rows, cols), batch)
    costs = {m: method_flops(m, rows, cols, steps, blocks) for m in ("standard", "gram")}
    return "gram" if costs["gram"] < costs["standard"] else "standard"


class Buffers(NamedTuple):
    """The workspace views for one call of :func:`newton_schulz_`.

    A ``NamedTuple`` (not a frozen attrs class) so that ``torch.compile`` can
    trace its construction inside ``step``.

    Attributes:
        x: ``(B, r, c)``: the matrices to orthogonalise (overwritten).
        spare: like ``x``; scratch.
        squares: ``(B, k, k)`` scratch matrices (2 for "standard", 5 for "gram").
    """

    x: Tensor
    spare: Tensor
    squares: tuple[Tensor, ...]


def _buffer_shapes(rows: int, cols: int, method: str) -> dict[str, tuple[int, int]]:
    """The per-matrix shape of each buffer of ``method``: ``x``, ``spare``, ``square0``..."""
    k = min(rows, cols)
    shapes = {"x": (rows, cols), "spare": (rows, cols)}
    shapes.update({f"square{i}": (k, k) for i in range(_SQUARES[method])})
    return shapes


def allocate_buffers(
    rows: int, cols: int, batch: int, method: str, dtype: torch.dtype, device: torch.device
) -> Buffers:
    """Fresh :class:`Buffers` for ``batch`` matrices, outside any :class:`Workspace`.

    What a compiled step uses: ``torch.compile`` plans the memory of tensors
    it allocates itself, whereas persistent buffers would be graph inputs
    written back on every call (and a :class:`Workspace`, an attrs class,
    cannot be built while tracing).

    Args:
        rows: matrix rows.
        cols: matrix columns.
        batch: matrices orthogonalised together.
        method: ``"standard"`` or ``"gram"``.
        dtype: the Newton-Schulz dtype.
        device: where they live.

    Returns:
        Uninitialised buffers.
    """
    views = [
        torch.empty((batch, *shape), dtype=dtype, device=device)
        for shape in _buffer_shapes(rows, cols, method).values()
    ]
    return Buffers(views[0], views[1], tuple(views[2:]))


@attrs.define
class Workspace:
    """Reusable buffers for batches of ``(rows, cols)`` matrices; grown on demand.

    Attributes:
        rows: matrix rows.
        cols: matrix columns.
        dtype: the Newton-Schulz dtype.
        device: where the buffers live.
        buffers: ``x``, ``spare`` (batch, rows, cols) and ``square0``... (batch, k, k).
    """

    rows: int
    cols: int
    dtype: torch.dtype
    device: torch.device
    buffers: dict[str, Tensor] = attrs.field(factory=dict)

    def take(self, batch: int, method: str) -> Buffers:
        """Views for ``batch`` matrices orthogonalised by ``method`` ("standard"/"gram")."""
        shapes = _buffer_shapes(self.rows, self.cols, method)
        for name, shape in shapes.items():
            held = self.buffers.get(name)
            if held is None or held.shape[0] < batch:
                self.buffers[name] = torch.empty(
                    (batch, *shape), dtype=self.dtype, device=self.device
                )
        views = [self.buffers[name][:batch] for name in shapes]
        return Buffers(views[0], views[1], tuple(views[2:]))


def _matmul(
    out: Tensor,
    a: Tensor,
    b: Tensor,
    add: Tensor | None = None,
    beta: float = 1.0,
    alpha: float = 1.0,
) -> None:
    """``out = beta * add + alpha * a @ b`` over a batch (``mm`` when the batch is one)."""
    if out.shape[0] == 1:
        out, a, b, add = out[0], a[0], b[0], None if add is None else add[0]
        if add is None:
            torch.mm(a, b, out=out)
        else:
            torch.addmm(add, a, b, beta=beta, alpha=alpha, out=out)
    elif add is None:
        torch.bmm(a, b, out=out)
    else:
        torch.baddbmm(add, a, b, beta=beta, alpha=alpha, out=out)


def _symmetric_(
    out: Tensor,
    a: Tensor,
    b: Tensor,
    blocks: int,
    add: Tensor | None = None,
    beta: float = 1.0,
    alpha: float = 1.0,
) -> None:
    """``out = beta * add + alpha * a @ b`` for a symmetric result: lower block rows, mirrored."""
    size = out.shape[-1]
    edges = [size * i // blocks for i in range(blocks + 1)]
    for start, end in itertools.pairwise(edges):
        part = None if add is None else add[:, start:end, :end]
        _matmul(out[:, start:end, :end], a[:, start:end], b[:, :, :end], part, beta, alpha)
    for start, end in itertools.pairwise(edges[:-1]):
        out[:, start:end, end:].copy_(out[:, end:, start:end].mT)


def _gram_(out: Tensor, x: Tensor, tall: bool, blocks: int) -> None:
    """``out = X Xᵀ`` (wide) or ``Xᵀ X`` (tall)."""
    wide = x.mT if tall else x
    _symmetric_(out, wide, wide.mT, blocks)


def _apply_(out: Tensor, m: Tensor, x: Tensor, tall: bool, beta: float = 0.0) -> None:
    """``out = beta X + M X`` (wide) or ``beta X + X M`` (tall); ``M`` is symmetric."""
    left, right = (x, m) if tall else (m, x)
    _matmul(out, left, right, x if beta else None, beta)


_Schedule = tuple[tuple[float, float, float], ...]


def _standard(buffers: Buffers, schedule: _Schedule, blocks: int) -> Tensor:
    x, spare = buffers.x, buffers.spare
    gram, poly = buffers.squares[:2]
    tall = x.shape[-2] > x.shape[-1]
    for a, b, c in schedule:
        _gram_(gram, x, tall, blocks)
        _symmetric_(poly, gram, gram, blocks, gram, b, c)
        _apply_(spare, poly, x, tall, a)
        x, spare = spare, x
    return x


def _gram(buffers: Buffers, schedule: _Schedule, blocks: int) -> Tensor:
    x, spare = buffers.x, buffers.spare
    gram, poly, temp, accum, accum_spare = buffers.squares
    tall = x.shape[-2] > x.shape[-1]
    _gram_(gram, x, tall, blocks)
    steps = len(schedule)
    for (fresh, restart, last), (a, b, c) in zip(_gram_schedule(steps), schedule, strict=True):
        _symmetric_(poly, gram, gram, blocks, gram, b, c)  # P = bA + cA²
        if last and fresh:
            _apply_(spare, poly, x, tall, a)  # X <- aX + PX
            return spare
        if fresh:  # Q = aI + P
            accum.copy_(poly).diagonal(dim1=-2, dim2=-1).add_(a)
        else:  # Q <- (aI + P) Q
            _symmetric_(accum_spare, poly, accum, blocks, accum, a)
            accum, accum_spare = accum_spare, accum
        if last or restart:  # X <- Q X
            _apply_(spare, accum, x, tall)
            x, spare = spare, x
            if last:
                return x
            _gram_(gram, x, tall, blocks)
        else:  # A <- (aI + P) A (aI + P)
            _symmetric_(temp, poly, gram, blocks, gram, a)
            _symmetric_(gram, poly, temp, blocks, temp, a)
    raise ValueError(f"steps must be >= 1, got {steps}")


def newton_schulz_(
    buffers: Buffers,
    *,
    steps: int,
    coefficients: tuple[float, float, float] | str,
    eps: float,
    method: str,
) -> Tensor:
    """Orthogonalise the batch ``buffers.x`` (``(B, r, c)``), using the other buffers as scratch.

    Each matrix is divided by its Frobenius norm (times 1.01 for
    ``"polar_express"``, the paper's safety margin), floored at ``eps``, then
    iterated with the schedule of :func:`~optiplug_muon.coefficients.coefficient_schedule`.

    Args:
        buffers: from :meth:`Workspace.take` with the same ``method``; all overwritten.
        steps: iterations (>= 1).
        coefficients: (a, b, c), ``"quintic"`` or ``"polar_express"``.
        eps: floor of the Frobenius norm (an all-zero matrix stays zero).
        method: ``"standard"`` or ``"gram"`` (see :func:`resolve_method`).

    Returns:
        One of the buffers, holding the result.
    """
    x = buffers.x
    norms = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True)
    scale = input_scale(coefficients)
    if scale != 1.0:
        norms.mul_(scale)
    x.div_(norms.clamp_(min=eps))
    blocks = symmetric_blocks(x.device.type, min(x.shape[-2:]), x.shape[0])
    iterate = _gram if method == "gram" else _standard
    return iterate(buffers, coefficient_schedule(coefficients, steps), blocks)


def check_coefficients(coefficients: object) -> None:
    """Raise unless ``coefficients`` is a name in :data:`NS_COEFFICIENTS` or a safe (a, b, c).

    Raises:
        HyperparameterError: naming ``ns_coefficients``, the value and the choices.
    """
    if isinstance(coefficients, str):
        if coefficients in NS_COEFFICIENTS:
            return
        choices = " | ".join(repr(name) for name in NS_COEFFICIENTS)
        reason = f"must be one of {choices} or three finite numbers (a, b, c)"
        raise HyperparameterError("ns_coefficients", coefficients, reason, algorithm="muon")
    try:
        MuonConfig(ns_coefficients=coefficients)  # type: ignore[arg-type]
    except HyperparameterError as error:
        raise HyperparameterError(
            "ns_coefficients", coefficients, error.reason, algorithm="muon"
        ) from None


def orthogonalize(
    matrix: Tensor,
    *,
    steps: int = 5,
    coefficients: tuple[float, float, float] | str = QUINTIC,
    eps: float = 1e-7,
    dtype: torch.dtype | None = None,
    method: str = "auto",
) -> Tensor:
    """Newton-Schulz-orthogonalise one matrix or a batch (``(..., r, c)``), without a workspace.

    Muon's orthogonalisation, for studying the polynomials: with
    ``coefficients="quintic"`` (Jordan's fixed quintic) the singular values
    end spread around 1, with ``"polar_express"`` (Amsel et al., arXiv
    2505.16932: a minimax-optimal polynomial per iteration) closer to 1 at
    the same cost; ``torch.linalg.svdvals`` of the result shows it.

    Args:
        matrix: the input (not modified), at least 2-D.
        steps: iterations (>= 1).
        coefficients: ``(a, b, c)``, ``"quintic"`` or ``"polar_express"``
            (see :data:`~optiplug_muon.coefficients.NS_COEFFICIENTS`).
        eps: floor of the Frobenius norm.
        dtype: compute dtype (default: :func:`default_ns_dtype` of its device).
        method: one of :data:`~optiplug_muon.config.NS_METHODS`.

    Returns:
        The orthogonalised matrices, in ``dtype``, shaped like ``matrix``.

    Raises:
        HyperparameterError: bad ``steps``, ``coefficients`` or ``method``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise HyperparameterError("ns_steps", steps, "must be an integer >= 1", algorithm="muon")
    check_coefficients(coefficients)
    rows, cols = matrix.shape[-2:]
    dtype = dtype or default_ns_dtype(matrix.device.type)
    x = matrix.reshape(-1, rows, cols).to(dtype, copy=True)
    method = resolve_method(method, rows, cols, steps, matrix.device.type, x.shape[0])
    workspace = Workspace(rows, cols, dtype, matrix.device)
    buffers = workspace.take(x.shape[0], method)
    buffers.x.copy_(x)
    out = newton_schulz_(buffers, steps=steps, coefficients=coefficients, eps=eps, method=method)
    return out.reshape(matrix.shape)
