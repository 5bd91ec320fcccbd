"""Structural checks of a :class:`~optiplug._state.codec.QuantizedState`: nothing is trusted.

A quantized slot read from a checkpoint (or built by hand) is made of plain
tensors and a few labels, and each of them follows from the slot's shape and
precision:

* ``precision`` is ``"int8"``, ``"int4"`` or ``"bf16"``; ``signed`` and
  ``linear`` are booleans, ``writes`` a non-negative integer;
* int8/int4: ``codes`` is a flat ``uint8`` tensor of ``blocks * block *
  bits / 8`` bytes and ``scales`` a flat float32 tensor of ``blocks``
  block maxima, finite and non-negative, where ``blocks`` is the element
  count over the precision's block size, rounded up;
* bf16: ``codes`` is a flat ``bfloat16`` tensor of one value per element and
  ``scales`` is empty;
* ``factors``, where present, is a float32 ``(rows + cols, rank)`` matrix
  (``rows`` the first dimension, ``cols`` the rest, ``rank`` below both),
  finite, whose upper ``P`` is orthonormal or all zero (a subspace
  iteration's basis, or a slot that restarts its factors), and whose lower
  ``Q`` has a squared norm finite in float32 (``Q = M.T @ P`` is no larger
  than the momentum itself, which Newton-Schulz normalises by its norm);
* every inner tensor is on the slot's device.

Only a slot that passes these checks is decoded; its decoded value then
takes the slot's constraints (finite, non-negative) like a plain tensor, so
negative scales on a second moment or factors that overflow are refused
rather than stepped on. :func:`structure_findings` is the one validator
``checkpoint.save``, ``checkpoint.load``, ``optiplug check`` and
``load_state_dict`` share (through the state checks), and the decoder
checks the same sizes before the C loops read a byte.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .codec import BLOCK_SIZES, QuantizedState
from .precision import CODE_BITS

__all__ = [
    "ORTHONORMAL_TOLERANCE",
    "coded_sizes",
    "role_finding",
    "structure_findings",
]

Finding = tuple[str, str, str]

ORTHONORMAL_TOLERANCE = 1e-3
"""How far ``P.T @ P`` of a low-rank slot's factors may be from the identity, elementwise.

A QR in float32 gives ``P`` orthonormal to a few ulps (about ``rank * 6e-8``);
the bound is four orders above that and far below what a scaled or
transposed factor gives (1e30, or an order-one error)."""

_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def coded_sizes(numel: int, precision: str) -> tuple[int, int]:
    """``(code bytes, scales)`` an int8/int4 slot of ``numel`` elements stores.

    Args:
        numel: the slot's element count.
        precision: ``"int8"`` or ``"int4"``.

    Returns:
        The codes' byte count (whole blocks) and the block count.
    """
    block = BLOCK_SIZES[precision]
    blocks = -(-numel // block)
    return blocks * block * CODE_BITS[precision] // 8, blocks


def structure_findings(value: QuantizedState) -> list[Finding]:
    """Every way ``value``'s parts disagree with its shape and precision (see the module).

    Never raises and never decodes: the checks read sizes, dtypes, labels and
    the scales' and factors' values only.

    Args:
        value: the quantized slot.

    Returns:
        ``(kind, expected, found)`` findings; empty when the slot can be decoded.
    """
    labels = _label_findings(value)
    if labels:
        return labels
    found = _device_findings(value)
    if value.precision == "bf16":
        return found + _bf16_findings(value)
    return found + _coded_findings(value) + _factor_findings(value)


def role_finding(key: str, value: QuantizedState, second_moments: frozenset[str]) -> Finding | None:
    """A finding when ``value``'s table is not the one slot ``key`` takes.

    A second moment (a name in ``second_moments``) is stored unsigned, any
    other slot signed: read in the other table, its codes decode to other
    values than were stored.

    Args:
        key: the slot's name.
        value: the quantized slot.
        second_moments: the optimizer's second-moment slot names.

    Returns:
        The finding, or None when the table fits.
    """
    if value.precision == "bf16":
        return None
    wanted = key not in second_moments
    if value.signed is wanted:
        return None
    role = "another slot's signed table" if wanted else "a second moment's unsigned table"
    label = f"signed={value.signed!r}"
    return ("quantized-table", f"{role} (signed={wanted!r})", label)


def _label_findings(value: QuantizedState) -> list[Finding]:
    precision = getattr(value, "precision", None)
    if precision not in ("int8", "int4", "bf16"):
        return [("quantized-precision", "int8, int4 or bf16", repr(precision)[:60])]
    for name in ("signed", "linear"):
        if not isinstance(getattr(value, name, None), bool):
            return [("quantized-label", f"{name}: a bool", repr(getattr(value, name, None))[:60])]
    writes = getattr(value, "writes", None)
    if isinstance(writes, bool) or not isinstance(writes, int) or writes < 0:
        return [("quantized-label", "writes: an integer >= 0", repr(writes)[:60])]
    if not value.is_floating_point():
        return [("dtype", "a floating dtype", str(value.dtype).removeprefix("torch."))]
    return []


def _device_findings(value: QuantizedState) -> list[Finding]:
    parts = [("codes", value.codes), ("scales", value.scales)]
    if value.factors is not None:
        parts.append(("factors", value.factors))
    for name, part in parts:
        if not isinstance(part, torch.Tensor) or part.device != value.device:
            where = getattr(part, "device", type(part).__name__)
            return [("quantized-part", f"{name}: a tensor on {value.device}", str(where))]
    return []


def _bf16_findings(value: QuantizedState) -> list[Finding]:
    found = []
    if value.codes.dtype != torch.bfloat16 or value.codes.shape != (value.numel(),):
        found.append(_part("codes", f"bfloat16 [{value.numel()}]", value.codes))
    if value.scales.numel() != 0:
        found.append(_part("scales", "empty (bf16 has none)", value.scales))
    return found


def _coded_findings(value: QuantizedState) -> list[Finding]:
    code_bytes, blocks = coded_sizes(value.numel(), value.precision)
    found = []
    if value.codes.dtype != torch.uint8 or value.codes.shape != (code_bytes,):
        found.append(_part("codes", f"uint8 [{code_bytes}]", value.codes))
    if value.scales.dtype != torch.float32 or value.scales.shape != (blocks,):
        return [*found, _part("scales", f"float32 [{blocks}]", value.scales)]
    if blocks and not _finite_non_negative(value.scales):
        low = value.scales.min().item()
        found.append(("quantized-scales", "finite block maxima >= 0", f"minimum {low!r}"))
    return found


def _factor_findings(value: QuantizedState) -> list[Finding]:
    factors = value.factors
    if factors is None:
        return []
    rows = value.shape[0] if value.ndim >= 2 else 0
    cols = value.numel() // rows if rows else 0
    rank = factors.shape[1] if factors.ndim == 2 else 0
    shaped = factors.dtype == torch.float32 and factors.shape == (rows + cols, rank)
    if not (shaped and 0 < rank < min(rows, cols)):
        return [_part("factors", f"float32 [{rows} + {cols}, rank below both]", factors)]
    if not bool(torch.isfinite(factors).all()):
        return [("quantized-factors", "finite factors", "NaN or Inf")]
    return _basis_findings(factors[:rows]) + _norm_findings(factors[rows:])


def _basis_findings(basis: torch.Tensor) -> list[Finding]:
    if not bool(basis.any()):
        return []  # all zero: the slot restarts its factors
    gram = basis.double().T @ basis.double()
    error = (gram - torch.eye(gram.shape[0], dtype=torch.float64)).abs().max().item()
    if error <= ORTHONORMAL_TOLERANCE:
        return []
    expected = f"P orthonormal (|P.T @ P - I| <= {ORTHONORMAL_TOLERANCE}) or all zero"
    return [("quantized-factors", expected, f"{error:.3g}")]


def _norm_findings(projection: torch.Tensor) -> list[Finding]:
    squared = float(projection.double().square().sum())
    if squared <= _FLOAT32_MAX:
        return []
    found = "inf" if math.isinf(squared) else f"{squared:.3g}"
    return [("quantized-factors", "Q's squared norm finite in float32", found)]


def _finite_non_negative(scales: torch.Tensor) -> bool:
    return bool((torch.isfinite(scales) & (scales >= 0)).all())


def _part(name: str, expected: str, found: Any) -> Finding:
    dtype = str(getattr(found, "dtype", type(found).__name__)).removeprefix("torch.")
    shape = list(getattr(found, "shape", ()))
    return ("quantized-part", f"{name}: {expected}", f"{dtype} {shape}")
