"""The :class:`QuantizedState` tensor: a state slot stored as codes, scales and factors.

What each precision stores is told in :mod:`optiplug._state.codec`, the
path this class and its pickle constructor are named from.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .blockwise import _decode_blocks, _encode_blocks, _stochastic_bf16
from .low_rank import _factorable, _factored
from .precision import BLOCK_SIZES, CODE_BITS

__all__ = ["QuantizedState"]

_BITS = CODE_BITS


class QuantizedState(torch.Tensor):
    """A state tensor stored in low precision (see the module docstring).

    Attributes:
        codes: uint8 codes (int8/int4) or the bfloat16 values (bf16).
        scales: float32 per-block maxima (an empty tensor for bf16).
        precision: ``"int8"``, ``"int4"`` or ``"bf16"``.
        signed: whether the table has negative values (False: a second moment).
        linear: whether the codes index :func:`linear_table` (a slot named in
            an optimizer's ``linear_slots``) rather than the dynamic table.
        writes: how many times the value was stored (seeds bf16's rounding).
        factors: a low-rank slot's float32 ``(rows + cols, rank)`` factors,
            ``P`` above ``Q``, the value being ``P @ Q.T`` plus the decoded
            codes (None: the codes hold the whole value).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    precision: str
    signed: bool
    linear: bool
    writes: int
    factors: torch.Tensor | None

    @staticmethod
    def __new__(
        cls,
        codes: torch.Tensor,
        scales: torch.Tensor,
        precision: str,
        signed: bool,
        shape: Sequence[int],
        dtype: torch.dtype,
        writes: int = 0,
        linear: bool = False,
        factors: torch.Tensor | None = None,
    ) -> QuantizedState:
        made = torch.Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=dtype, device=codes.device
        )
        made.codes, made.scales = codes, scales
        made.precision, made.signed, made.writes = precision, signed, writes
        made.linear, made.factors = linear, factors
        return made

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @classmethod
    def encode(
        cls,
        value: torch.Tensor,
        precision: str,
        *,
        signed: bool,
        writes: int = 0,
        linear: bool = False,
        rank: int = 0,
    ) -> QuantizedState:
        """``value`` stored in ``precision`` (``"int8"``, ``"int4"`` or ``"bf16"``).

        ``linear`` codes int8/int4 by :func:`linear_table`; bf16 ignores it.
        ``rank`` > 0 keeps factors of that rank beside int8/int4 codes of a
        matrix whose two sides both exceed it (see the module docstring).
        """
        linear = linear and precision != "bf16"
        factors, residual = None, value
        if precision != "bf16" and _factorable(value.shape, rank):
            factors, residual = _factored(value, None, rank)
        codes, scales = _encoded(residual, precision, signed, writes, linear)
        return cls(
            codes, scales, precision, signed, value.shape, value.dtype, writes, linear, factors
        )

    @property
    def rank(self) -> int:
        """The rank of the factors (0: none)."""
        return 0 if self.factors is None else int(self.factors.shape[1])

    def dequantize(self) -> torch.Tensor:
        """The value, decoded to a plain tensor of this tensor's dtype."""
        if self.precision == "bf16":
            if self.codes.dtype != torch.bfloat16 or self.codes.numel() != self.numel():
                raise ValueError(
                    f"a bf16 QuantizedState of {self.numel()} elements holds "
                    f"{self.codes.numel()} {self.codes.dtype} values"
                )
            return self.codes.to(self.dtype).reshape(self.shape)
        bits, block = _BITS[self.precision], BLOCK_SIZES[self.precision]
        flat = _decode_blocks(
            self.codes, self.scales, bits, self.signed, self.numel(), block, self.linear
        )
        if self.factors is not None:  # flat is new: the factors' part is added in place
            rows = self.shape[0]
            flat.view(rows, -1).addmm_(self.factors[:rows], self.factors[rows:].T)
        return flat.to(self.dtype).reshape(self.shape)

    def store(self, value: torch.Tensor) -> None:
        """Write ``value`` (a plain tensor of this shape) into the codes and scales, in place.

        Factors, when kept, are refreshed first by one subspace iteration
        warm-started from the ones held.
        """
        self.writes += 1
        residual = value
        if self.factors is not None:
            factors, residual = _factored(value, self.factors, self.rank)
            self.factors.copy_(factors)
        codes, scales = _encoded(residual, self.precision, self.signed, self.writes, self.linear)
        self.codes.copy_(codes)
        self.scales.copy_(scales)

    def __tensor_flatten__(self) -> tuple[list[str], tuple[Any, ...]]:
        dtype = str(self.dtype).removeprefix("torch.")
        context = (self.precision, self.signed, self.writes, dtype, self.linear)
        inner = ["codes", "scales"] if self.factors is None else ["codes", "scales", "factors"]
        return inner, context

    @classmethod
    def __tensor_unflatten__(
        cls,
        inner: dict[str, torch.Tensor],
        context: tuple[Any, ...],
        outer_size: Sequence[int],
        outer_stride: Sequence[int],
    ) -> QuantizedState:
        precision, signed, writes, dtype, *rest = context  # no ``linear``: saved before it was
        decoded = getattr(torch, dtype)
        linear = bool(rest[0]) if rest else False
        return cls(
            inner["codes"],
            inner["scales"],
            precision,
            signed,
            outer_size,
            decoded,
            writes,
            linear,
            inner.get("factors"),
        )

    def __reduce_ex__(self, protocol: Any) -> Any:
        parts = (self.codes, self.scales, self.precision, self.signed, tuple(self.shape))
        return (_rebuilt, (*parts, self.dtype, self.writes, self.linear, self.factors))

    def __deepcopy__(self, memo: dict[int, Any]) -> QuantizedState:
        copied = _clone(self)
        memo[id(self)] = copied
        return copied

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (
            f"QuantizedState({self.precision}, shape={tuple(self.shape)}, "
            f"signed={self.signed}, linear={self.linear}, rank={self.rank}, "
            f"value={self.dequantize()!r})"
        )

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # torch declares it as a plain function
        cls,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(*args, **kwargs)
        if func._schema.is_mutable:  # an in-place op on a decoded copy would be lost
            raise TypeError(
                f"{func} would change a QuantizedState in place; decode it with "
                ".dequantize(), compute, and write back with .store(value)"
            )
        return func(*tree_map(_plain, args), **tree_map(_plain, kwargs))


def _rebuilt(
    codes: torch.Tensor,
    scales: torch.Tensor,
    precision: str,
    signed: bool,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    writes: int,
    linear: bool = False,
    factors: torch.Tensor | None = None,
) -> QuantizedState:
    """The pickle constructor of :class:`QuantizedState` (``linear`` and ``factors``: absent
    before they were)."""
    return QuantizedState(codes, scales, precision, signed, shape, dtype, writes, linear, factors)


QuantizedState.__module__ = _rebuilt.__module__ = "optiplug._state.codec"
"""The path checkpoints name them from (:mod:`optiplug.base` publishes the class as its own)."""

torch.serialization.add_safe_globals([_rebuilt])
"""A sharded checkpoint (DCP) pickles a quantized shard as ``_rebuilt(codes, scales, ...)``,
and reads it back with ``torch.load(weights_only=True)``: it builds from tensors and
plain values only."""


def _encoded(
    value: torch.Tensor, precision: str, signed: bool, writes: int, linear: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    if precision == "bf16":
        empty = torch.empty(0, dtype=torch.float32, device=value.device)
        return _stochastic_bf16(value, writes).reshape(-1), empty
    return _encode_blocks(value, _BITS[precision], signed, BLOCK_SIZES[precision], linear)


def _plain(value: Any) -> Any:
    return value.dequantize() if isinstance(value, QuantizedState) else value


def _same_kind(
    source: QuantizedState,
    codes: torch.Tensor,
    scales: torch.Tensor,
    factors: torch.Tensor | None = None,
) -> QuantizedState:
    return QuantizedState(
        codes,
        scales,
        source.precision,
        source.signed,
        source.shape,
        source.dtype,
        source.writes,
        source.linear,
        factors,
    )


def _detach(value: QuantizedState) -> QuantizedState:
    return _same_kind(value, value.codes, value.scales, value.factors)


def _clone(value: QuantizedState, **_: Any) -> QuantizedState:
    factors = None if value.factors is None else value.factors.clone()
    return _same_kind(value, value.codes.clone(), value.scales.clone(), factors)


def _copy(target: Any, source: Any, non_blocking: bool = False) -> Any:
    if isinstance(target, QuantizedState):
        if isinstance(source, QuantizedState) and _stored_in(
            source, target.precision, target.signed, target.linear, target.rank
        ):
            target.codes.copy_(source.codes)
            target.scales.copy_(source.scales)
            if target.factors is not None and source.factors is not None:
                target.factors.copy_(source.factors)
        else:
            target.store(_plain(source).reshape(target.shape))
        return target
    return target.copy_(_plain(source))


def _stored_in(
    value: QuantizedState, precision: str, signed: bool, linear: bool, rank: int = 0
) -> bool:
    """Whether ``value`` is stored in ``precision``, the table ``signed``/``linear`` name and
    with factors of ``rank`` where its shape takes them (bf16 has no table and no factors)."""
    if value.precision != precision or value.signed != signed:
        return False
    if precision == "bf16":
        return True
    wanted = rank if _factorable(value.shape, rank) else 0
    return value.linear == linear and value.rank == wanted


def _zero(value: QuantizedState) -> QuantizedState:
    value.store(torch.zeros(value.shape, dtype=value.dtype, device=value.device))
    return value


def _to_copy(value: QuantizedState, **kwargs: Any) -> Any:
    device = kwargs.get("device")
    dtype = kwargs.get("dtype")
    if dtype not in (None, value.dtype):
        return value.dequantize().to(dtype=dtype, device=device)
    factors = None if value.factors is None else value.factors.to(device=device)
    return _same_kind(value, value.codes.to(device=device), value.scales.to(device=device), factors)


def _view(value: QuantizedState, size: Sequence[int]) -> torch.Tensor:
    """A view of the same shape shares the codes (a DTensor views its shard so); others decode."""
    if tuple(size) == tuple(value.shape):
        return _detach(value)
    return value.dequantize().view(size)


_aten = torch.ops.aten
_HANDLERS: dict[Any, Callable[..., Any]] = {
    _aten.view.default: _view,
    _aten.detach.default: _detach,
    _aten.clone.default: _clone,
    _aten.copy_.default: _copy,
    _aten.zero_.default: _zero,
    _aten._to_copy.default: _to_copy,
}
