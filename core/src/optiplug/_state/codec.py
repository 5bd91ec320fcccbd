"""Low-precision optimizer state: a codec any algorithm's declared slots can use.

A state slot kept in ``"int8"``, ``"int4"`` or ``"bf16"`` is a
:class:`QuantizedState`: a wrapper tensor subclass that looks like the
full-precision tensor (its shape and dtype are the parameter's) and stores

* ``int8``/``int4``: one code per element (two per byte for int4) and one
  float32 scale, the absolute maximum, per block of :data:`BLOCK_SIZES`
  elements (256 and 128). A code indexes a *dynamic-exponent* table
  (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization",
  arXiv 2110.02861): a run of leading zero bits says the power of ten, the
  remaining bits a linear fraction, so values spanning six or seven decades
  below the block's maximum keep a relative error of a few percent. A
  second moment (a slot declared ``non_negative``) uses the unsigned table
  *without zero* (Li et al. 2023, "Memory Efficient Optimizers with 4-bit
  States", arXiv 2309.01507: a second moment rounded to zero turns
  ``m / (sqrt(v) + eps)`` into a huge step); its smallest code is one more
  decade down instead; in int4 it takes the *linear* unsigned map without
  zero, ``k / 16`` for ``k = 1..16`` (the same paper's, and torchao's), as
  16 dynamic values over four decades leave it too coarse
  (:data:`LINEAR_SECOND_MOMENTS`). A slot an optimizer names in its
  ``linear_slots`` (Muon's momentum) takes the *linear* signed table instead:
  ``k / (2**(bits-1) - 1)`` for every integer ``k`` of that magnitude or
  less, the symmetric linear map Gupta et al. 2025 ("Effective Quantization
  of Muon Optimizer States", arXiv 2509.23106) quantize Muon's momentum with.
* A slot an optimizer names in its ``low_rank_slots`` (Muon's momentum) and
  that is a matrix (its first dimension by the rest, both above
  :data:`LOW_RANK`) keeps, beside the codes, float32 *factors*: an
  orthonormal ``P`` (rows x :data:`LOW_RANK`) spanning the matrix's leading
  columns and ``Q = M.T @ P``; the codes store only the residual
  ``M - P @ Q.T``. ``P`` comes from one step of subspace (block power)
  iteration, ``orth(M @ Q_previous)``, warm-started from the factors the
  slot held before (from fixed hashed vectors, iterated
  :data:`START_ITERATIONS` times, when it held none). A momentum whose
  singular values fall steeply (Muon's early steps: the largest 24 to 736
  times the median) then loses its small directions to rounding no more than
  a flat one: Newton-Schulz lifts every direction to one, so rounding error
  there became a large part of the update. The factors cost
  ``4 * LOW_RANK * (rows + cols)`` bytes, 0.8% of the codes of a
  4096 x 4096 matrix.
* ``bf16``: the value rounded stochastically to bfloat16 (random bits added
  below the 16 kept ones, then truncated), which is unbiased, so small
  updates accumulate instead of vanishing. The random bits are a hash of
  each element's index and the slot's write count, kept in the state, so a
  resumed run draws the same bits.

Tensors under :data:`MIN_QUANTIZED_NUMEL` elements stay full precision, as
the peers do: their blocks' scales would cost as much as the saving.

The kernels decode a slot to a float32 tensor (:meth:`QuantizedState.dequantize`),
update it, and write it back (:meth:`QuantizedState.store`); torch ops on a
``QuantizedState`` other than those run on its decoded value (so state
checks, ``torch.equal`` and printing work), and in-place ones other than
``copy_`` and ``zero_`` are refused rather than lost.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ..errors import HyperparameterError
from ..validators import STATE_PRECISIONS
from .code_rule import code_rule
from .native_codec import NativeCodec, native_codec
from .precision import BLOCK_SIZES, CODE_BITS

__all__ = [
    "BLOCK_SIZES",
    "LOW_RANK",
    "MIN_QUANTIZED_NUMEL",
    "QuantizedState",
    "SECOND_MOMENTS",
    "convert_state",
    "dynamic_table",
    "in_precision",
    "linear_table",
    "group_precision",
    "run_in_state_precision",
    "step_in_state_precision",
    "stepping_view",
]

CHUNK = 1 << 18
"""Elements encoded at a time: the temporaries of a chunk (1 MB each) stay in cache,
which made encoding 2.4x faster than whole tensors on a 2-core CPU."""

MIN_QUANTIZED_NUMEL = 4096
"""Smaller state tensors stay full precision (torchao's threshold)."""

LOW_RANK = 4
"""The rank of a low-rank slot's float32 factors. On the train job's default
config, int8 Muon with rank-4 factors ended -0.008, +0.001 and +0.001 nats
from fp32 on seeds 0 to 2, against +0.026, +0.010 and +0.015 without; ranks
2 and 8 did no better on seed 0 (simulated with an exact SVD)."""

START_ITERATIONS = 2
"""Subspace iterations of a low-rank slot's first factors (from hashed vectors);
each later write takes one, warm-started from the factors before it."""

_BITS = CODE_BITS


# ------------------------------------------------------------------ the tables
def _magnitudes(bits: int, signed: bool, zero: bool) -> list[float]:
    """A dynamic-exponent code's magnitudes, indexed by their code (see :func:`dynamic_table`).

    With ``k`` magnitude bits, index 0 is 0 (or ``10**-k`` without ``zero``)
    and decade ``e`` (values in ``(10**-(e+1), 10**-e]``) takes the
    ``2**(k-1-e)`` indices from ``2**(k-1-e)`` on, ascending.
    """
    k = bits - 1 if signed else bits
    magnitudes = [0.0 if zero else 10.0**-k]
    for e in range(k - 1, -1, -1):
        steps = 2 ** (k - 1 - e)
        magnitudes += [10.0**-e * (0.1 + 0.9 * (j + 1) / steps) for j in range(steps)]
    return magnitudes


@functools.cache
def dynamic_table(bits: int, signed: bool, zero: bool = True) -> tuple[float, ...]:
    """The values of a dynamic-exponent code of ``bits`` bits, sorted: ``table[code]`` decodes.

    With ``k`` magnitude bits (``bits - 1`` when signed), a magnitude in
    decade ``e`` is ``10**-e * (0.1 + 0.9 * (j + 1) / 2**f)`` with
    ``f = k - 1 - e`` fraction bits ``j``: the fewer leading decades, the
    finer the fraction, as in Dettmers et al.'s dynamic tree quantization.
    1.0 is exact, so a block's maximum is too; the smallest non-zero
    magnitude is ``10**-(k-1)`` (``10**-k`` takes zero's place without
    ``zero``). A signed table holds each magnitude with both signs and 0
    twice (its ``2**bits`` codes are one more than its values).

    Args:
        bits: 4 or 8.
        signed: whether negative values have codes.
        zero: whether 0 has a code (a second moment's table has not).

    Returns:
        ``2**bits`` values in ascending order.
    """
    magnitudes = _magnitudes(bits, signed, zero)
    if not signed:
        return tuple(sorted(magnitudes))
    values = magnitudes + [-m for m in magnitudes if m != 0.0]
    return tuple(sorted(values + [0.0] * (2**bits - len(values))))


@functools.cache
def linear_table(bits: int, signed: bool) -> tuple[float, ...]:
    """The values of the linear code of ``bits`` bits, sorted: ``table[code]`` decodes.

    Signed: the magnitudes ``i / top`` (``top = 2**(bits-1) - 1``, ``i =
    0..top``) with both signs, 0 twice, as in :func:`dynamic_table` (0 and
    +/-1 exact). Unsigned: ``(i + 1) / 2**bits`` for ``i = 0..2**bits-1``,
    without zero (Li et al.'s linear map for a second moment).

    Args:
        bits: 4 or 8.
        signed: whether negative values have codes.

    Returns:
        ``2**bits`` values in ascending order.
    """
    if not signed:
        return tuple((i + 1) / 2**bits for i in range(2**bits))
    top = 2 ** (bits - 1) - 1
    magnitudes = [i / top for i in range(top + 1)]
    return (*(-m if m else 0.0 for m in reversed(magnitudes)), *magnitudes)


@functools.cache
def _table(bits: int, signed: bool, device: torch.device, linear: bool = False) -> torch.Tensor:
    """The decoding table (float32, on ``device``); a second moment's has no zero."""
    values = linear_table(bits, signed) if linear else dynamic_table(bits, signed, zero=signed)
    return torch.tensor(values, dtype=torch.float32).to(device)


# ------------------------------------------------------------------ encoding
def _blocks(flat: torch.Tensor, block: int) -> torch.Tensor:
    """``flat`` zero-padded to whole blocks, as ``(blocks, block)``."""
    padding = (-flat.numel()) % block
    if padding:
        flat = torch.nn.functional.pad(flat, (0, padding))
    return flat.view(-1, block)


@functools.cache
def _rule_tensors(
    bits: int, signed: bool, linear: bool, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """:func:`code_rule`'s thresholds, scales, shifts and slopes as float32 tensors on ``device``."""
    rule = code_rule(bits, signed, linear)
    return tuple(
        torch.tensor(values, dtype=torch.float32, device=device)
        for values in (rule.thresholds, rule.scales, rule.shifts, rule.slopes)
    )


def _codes(normalized: torch.Tensor, bits: int, signed: bool, linear: bool = False) -> torch.Tensor:
    """The code of each value in [-1, 1] by the table's decade rule (int32).

    A magnitude's decade is the number of thresholds at or above it; its
    index is ``round((m * scale - shift) * slope)`` in float32 with that
    decade's constants (:mod:`.code_rule`): the nearest table value's except
    within a few ulps of a midpoint. A magnitude above 1, inf
    or NaN reads 1. A negative value takes the mirrored code. ``linear``:
    the linear table's rule (one decade). The C loops of
    :mod:`.native_codec` compute the same, bit for bit.
    """
    magnitude = normalized.abs()
    magnitude = torch.where(magnitude <= 1.0, magnitude, 1.0)
    thresholds, scales, shifts, slopes = _rule_tensors(bits, signed, linear, magnitude.device)
    decade = torch.zeros(magnitude.shape, dtype=torch.int64, device=magnitude.device)
    for threshold in thresholds[1:]:
        decade += magnitude <= threshold
    index = torch.round((magnitude * scales[decade] - shifts[decade]) * slopes[decade])
    index = index.to(torch.int32)
    if not signed:
        return index
    half = 1 << (bits - 1)  # sorted: the negatives, 0 twice, the positives
    return torch.where(normalized < 0, (half - 1) - index, half + index)


def _encode_blocks(
    value: torch.Tensor, bits: int, signed: bool, block: int, linear: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (uint8; int4 packed two per byte) and per-block absolute maxima of ``value``.

    ``linear`` codes by :func:`linear_table`, otherwise by the dynamic table.
    """
    flat = value.detach().reshape(-1).float().contiguous()
    codec = _native_for(flat)
    if codec is None:
        return _encode_blocks_torch(flat, bits, signed, block, linear)
    blocks = -(-flat.numel() // block)
    codes = torch.empty(blocks * block * bits // 8, dtype=torch.uint8)
    scales = torch.empty(blocks, dtype=torch.float32)
    codec.encode(flat, bits, signed, block, (codes, scales), linear)
    return codes, scales


def _encode_blocks_torch(
    flat: torch.Tensor, bits: int, signed: bool, block: int, linear: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_encode_blocks` in torch ops (any device)."""
    blocks = _blocks(flat, block)
    scales = blocks.abs().amax(dim=1)
    inverses = scales.clamp_min(torch.finfo(torch.float32).tiny).reciprocal().unsqueeze(1)
    codes = torch.empty(blocks.shape, dtype=torch.uint8, device=blocks.device)
    rows = max(1, CHUNK // block)  # a chunk's temporaries stay in cache
    for start in range(0, blocks.shape[0], rows):
        part = slice(start, start + rows)
        codes[part] = _codes(blocks[part] * inverses[part], bits, signed, linear)
    flat_codes = codes.reshape(-1)
    if bits == 4:
        flat_codes = flat_codes[0::2] | (flat_codes[1::2] << 4)
    return flat_codes, scales


def _decode_blocks(
    codes: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    signed: bool,
    numel: int,
    block: int,
    linear: bool = False,
) -> torch.Tensor:
    """The float32 values :func:`_encode_blocks` stored (flat, ``numel`` elements).

    Raises:
        ValueError: ``codes`` or ``scales`` of another dtype or size than
            ``numel`` elements in blocks of ``block`` take: nothing is read.
    """
    _check_coded_parts(codes, scales, bits, block, numel)
    values = _table(bits, signed, codes.device, linear)
    codec = _native_for(codes)
    if codec is not None and codes.is_contiguous() and scales.is_contiguous():
        out = torch.empty(numel, dtype=torch.float32)
        codec.decode(codes, scales, bits, block, values, out)
        return out
    if bits == 4:
        codes = torch.stack((codes & 0xF, codes >> 4), dim=1).reshape(-1)
    decoded = values[codes.int()].view(scales.numel(), -1) * scales.unsqueeze(1)
    return decoded.reshape(-1)[:numel]


def _check_coded_parts(
    codes: torch.Tensor, scales: torch.Tensor, bits: int, block: int, numel: int
) -> None:
    """Raise ``ValueError`` unless ``codes``/``scales`` are what ``numel`` elements store."""
    blocks = -(-numel // block)
    code_bytes = blocks * block * bits // 8
    if (
        codes.dtype == torch.uint8
        and codes.numel() == code_bytes
        and scales.dtype == torch.float32
        and scales.numel() == blocks
    ):
        return
    raise ValueError(
        f"a {bits}-bit QuantizedState of {numel} elements stores {code_bytes} uint8 code "
        f"bytes and {blocks} float32 scales; it holds {codes.numel()} {codes.dtype} codes "
        f"and {scales.numel()} {scales.dtype} scales"
    )


def _native_for(tensor: torch.Tensor) -> NativeCodec | None:
    """The C codec when ``tensor`` is on a CPU and the codec is built, else None.

    Never waits for the build: until it is loaded (a background thread builds
    it) the torch ops run, which write the same codes bit for bit.
    """
    if tensor.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return native_codec(wait=False)


def _stochastic_bf16(value: torch.Tensor, seed: int) -> torch.Tensor:
    """``value`` (float32) rounded to bfloat16 stochastically, with bits hashed from ``seed``.

    The 16 random bits added below the kept ones are a hash of the element's
    index and ``seed`` (MurmurHash3's 32-bit finaliser), cheaper than a
    generator's draw and the same on every device.
    """
    bits = value.detach().float().contiguous().view(torch.int32)
    noise = _hashed(torch.arange(bits.numel(), dtype=torch.int32, device=bits.device), seed)
    rounded = (bits + noise.view(bits.shape)) & -65536  # the low 16 bits cleared: exact in bf16
    finite = torch.isfinite(value)
    return torch.where(finite, rounded.view(torch.float32), value.float()).to(torch.bfloat16)


_GOLDEN = -1640531535  # 0x9E3779B1 as an int32
_MIX = (-2048144789, -1028477387)  # MurmurHash3's fmix32 constants, as int32


def seed_term(seed: int) -> int:
    """What a write count ``seed`` adds to every hashed index (below 2**31)."""
    return seed * 0x27D4EB2F & 0x7FFFFFFF


def _hashed(index: torch.Tensor, seed: int) -> torch.Tensor:
    """16 well-mixed bits (0..65535) of each int32 ``index`` and ``seed``."""
    h = index * _GOLDEN + seed_term(seed)
    h = h ^ (h >> 16)
    h = h * _MIX[0]
    h = h ^ (h >> 13)
    h = h * _MIX[1]
    return (h ^ (h >> 16)) & 0xFFFF


# ------------------------------------------------------------------ the tensor
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
        return (
            _rebuilt,
            (
                self.codes,
                self.scales,
                self.precision,
                self.signed,
                tuple(self.shape),
                self.dtype,
                self.writes,
                self.linear,
                self.factors,
            ),
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> QuantizedState:
        copied = QuantizedState(
            self.codes.clone(),
            self.scales.clone(),
            self.precision,
            self.signed,
            self.shape,
            self.dtype,
            self.writes,
            self.linear,
            None if self.factors is None else self.factors.clone(),
        )
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


# ------------------------------------------------------------------ sharded (DTensor) state
def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a ``DTensor`` (none exists unless torch.distributed.tensor is loaded)."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    return dtensor is not None and isinstance(value, dtensor)


def local_of(value: Any) -> Any:
    """A ``DTensor``'s local shard as it is stored (quantized or not); anything else as it is."""
    return value._local_tensor if is_dtensor(value) else value


def sharded_like(like: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as the shard of a ``DTensor`` with ``like``'s mesh, placements, shape and stride.

    A :class:`QuantizedState` shard stays quantized inside it (DTensor views
    its shard at the same shape, which shares the codes).
    """
    from torch.distributed.tensor import DTensor  # deferred: imports torch

    return DTensor.from_local(
        local,
        like.device_mesh,  # type: ignore[attr-defined]  # a DTensor's
        like.placements,  # type: ignore[attr-defined]
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def decoded(value: torch.Tensor) -> torch.Tensor:
    """``value`` with its quantized storage (its own, or its shard's) decoded; else as it is."""
    local = local_of(value)
    if not isinstance(local, QuantizedState):
        return value
    return sharded_like(value, local.dequantize()) if local is not value else local.dequantize()


# ------------------------------------------------------------------ slots in a precision
def in_precision(
    value: torch.Tensor, precision: str, *, signed: bool, linear: bool = False, rank: int = 0
) -> torch.Tensor:
    """``value`` converted to ``precision`` (a plain tensor for ``"fp32"``).

    ``linear`` codes int8/int4 by :func:`linear_table` (a stored slot in the
    other table is re-encoded); ``rank`` > 0 keeps factors of that rank
    beside the codes of a matrix (see :meth:`QuantizedState.encode`).

    A tensor under :data:`MIN_QUANTIZED_NUMEL` elements, or one that is not
    floating point, stays as it is (plain, decoded if it was stored low). A
    ``DTensor`` (FSDP's sharded state) converts its local shard, blocks
    within the shard, and stays a ``DTensor`` of the same placements; whether
    it is quantized is decided by its global size, so every rank decides
    alike.
    """
    if is_dtensor(value):
        small = value.numel() < MIN_QUANTIZED_NUMEL
        chosen = "fp32" if small else precision
        local = local_of(value)
        converted = _in_precision_local(local, chosen, (signed, linear, rank), smallest=0)
        return value if converted is local else sharded_like(value, converted)
    return _in_precision_local(value, precision, (signed, linear, rank), MIN_QUANTIZED_NUMEL)


def _in_precision_local(
    value: torch.Tensor, precision: str, table: tuple[bool, bool, int], smallest: int
) -> torch.Tensor:
    """:func:`in_precision` of a plain (or quantized) tensor (``table``: signed, linear,
    rank); under ``smallest`` elements: plain."""
    plain: torch.Tensor = _plain(value)
    if precision == "fp32" or plain.numel() < smallest or not plain.is_floating_point():
        return plain
    if isinstance(value, QuantizedState) and _stored_in(value, precision, *table):
        return value
    writes = value.writes if isinstance(value, QuantizedState) else 0
    signed, linear, rank = table
    return QuantizedState.encode(
        plain, precision, signed=signed, writes=writes, linear=linear, rank=rank
    )


# ------------------------------------------------------------------ optimizers' state in a precision
SECOND_MOMENTS = frozenset({"exp_avg_sq", "max_exp_avg_sq"})
"""Slots kept with the unsigned table without zero, by default (torch's names for them)."""

NO_SLOTS: frozenset[str] = frozenset()
"""No slot takes the linear table, by default."""

LINEAR_SECOND_MOMENTS = frozenset({"int4"})
"""Precisions whose second moments take the linear table without zero, ``k / 16``
(Li et al. 2023's linear map, torchao's 4-bit second moment): with 16 codes, the
dynamic table's decades leave a second moment's relative error up to 53%."""


def group_precision(group: Mapping[str, Any]) -> str:
    """A param group's ``state_precision`` (``"fp32"`` when it has none)."""
    return str(group.get("state_precision", "fp32"))


def _is_state_tensor(key: Any, value: Any, param: torch.Tensor) -> bool:
    """Whether ``value`` is a per-element state slot of ``param`` (not a step counter)."""
    return (
        key != "step"
        and isinstance(value, torch.Tensor)
        and value.shape == param.shape
        and value.is_floating_point()
    )


def convert_state(
    optimizer: torch.optim.Optimizer,
    params: Sequence[torch.Tensor] | None = None,
    second_moments: frozenset[str] = SECOND_MOMENTS,
    linear_slots: frozenset[str] = NO_SLOTS,
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> None:
    """Store every parameter's state slots in its group's ``state_precision``.

    A slot in another precision is decoded and re-encoded; a slot under
    :data:`MIN_QUANTIZED_NUMEL` elements stays plain. Used after loading a
    state dict (a full-precision checkpoint into an int8 optimizer and back)
    and after each step of a low-precision group.

    Args:
        optimizer: any optimizer whose groups may carry ``state_precision``.
        params: only these parameters (None: all).
        second_moments: slot names that take the unsigned table without zero.
        linear_slots: slot names that take the linear signed table.
        low_rank_slots: slot names that keep :data:`LOW_RANK` factors beside
            int8/int4 codes, where they are matrices.
    """
    tables = (second_moments, linear_slots, low_rank_slots)
    forget_precisions(optimizer)
    chosen = None if params is None else {id(p) for p in params}
    for group in optimizer.param_groups:
        precision = group_precision(group)
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state or (chosen is not None and id(param) not in chosen):
                continue
            for key, value in list(state.items()):
                if _is_state_tensor(key, value, param):
                    state[key] = _slot_in_precision(key, value, precision, *tables)


def state_in_precision(
    state: dict[Any, dict[str, Any]],
    groups: Sequence[Mapping[str, Any]],
    second_moments: frozenset[str] = SECOND_MOMENTS,
    linear_slots: frozenset[str] = NO_SLOTS,
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> None:
    """Give each parameter of ``groups`` a new entry in ``state`` with its slots in its
    group's ``state_precision`` (:func:`convert_state` for state built aside).

    The entries are replaced, never changed in place, so a state mapping
    that shares entries with an optimizer leaves that optimizer as it was
    when this raises: loading converts the new state before swapping it in.

    Args:
        state: parameter -> slots, as an optimizer's ``state``.
        groups: the param groups the parameters belong to.
        second_moments: slot names that take the unsigned table without zero.
        linear_slots: slot names that take the linear signed table.
        low_rank_slots: slot names that keep :data:`LOW_RANK` factors.
    """
    tables = (second_moments, linear_slots, low_rank_slots)
    for group in groups:
        precision = group_precision(group)
        for param in group["params"]:
            entry = state.get(param)
            if entry:
                state[param] = {
                    key: _slot_in_precision(key, value, precision, *tables)
                    if _is_state_tensor(key, value, param)
                    else value
                    for key, value in entry.items()
                }


def slot_table(
    key: str,
    precision: str,
    second_moments: frozenset[str],
    linear_slots: frozenset[str],
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> tuple[bool, bool, int]:
    """``(signed, linear, rank)``: the table and factors slot ``key`` takes in ``precision``.

    A second moment takes the unsigned table without zero: the dynamic one,
    or in :data:`LINEAR_SECOND_MOMENTS` precisions the linear one. Any other
    slot takes the signed table: linear when named in ``linear_slots``. A
    slot named in ``low_rank_slots`` keeps :data:`LOW_RANK` factors (bf16:
    none).
    """
    signed = key not in second_moments
    if precision == "bf16":
        return signed, False, 0
    linear = key in linear_slots if signed else precision in LINEAR_SECOND_MOMENTS
    return signed, linear, LOW_RANK if key in low_rank_slots else 0


def _slot_in_precision(
    key: str,
    value: torch.Tensor,
    precision: str,
    second_moments: frozenset[str],
    linear_slots: frozenset[str],
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> torch.Tensor:
    """Slot ``key``'s ``value`` in ``precision``, in the table its name calls for."""
    tables = (second_moments, linear_slots, low_rank_slots)
    signed, linear, rank = slot_table(key, precision, *tables)
    return in_precision(value, precision, signed=signed, linear=linear, rank=rank)


StepRun = Callable[[Any], None]
"""A step's update over the param groups of the optimizer (or view of it) it is given."""

StoredStateStep = Callable[[Any, dict[str, Any], torch.Tensor], bool]
"""``(optimizer, group, param) -> bool``: step ``param`` on its stored codes (True) or decline."""

SlotTables = tuple[frozenset[str], frozenset[str], frozenset[str]]
"""The second moments', the linear slots' and the low-rank slots' names."""


def stepping_view(optimizer: Any, param_groups: list[dict[str, Any]]) -> Any:
    """A shallow twin of ``optimizer`` whose ``param_groups`` are ``param_groups``.

    It shares everything else (state, defaults, hooks, flags), so a step run
    on it updates the optimizer's parameters and state while the
    optimizer's own ``param_groups`` stay as they are.
    """
    view = object.__new__(type(optimizer))
    vars(view).update(vars(optimizer))
    view.param_groups = param_groups
    vars(view)[_VIEW_OF] = origin_of(optimizer)
    return view


_VIEW_OF = "_optiplug_view_of"


def origin_of(optimizer: Any) -> Any:
    """The optimizer a :func:`stepping_view` was made of (an optimizer is its own origin)."""
    return vars(optimizer).get(_VIEW_OF, optimizer)


def run_in_state_precision(
    optimizer: Any,
    run: StepRun,
    tables: SlotTables = (SECOND_MOMENTS, NO_SLOTS, NO_SLOTS),
    stored_step: StoredStateStep | None = None,
) -> None:
    """Run ``run`` (a step's update) in each param group's ``state_precision``.

    Full-precision groups step together, as they always do. A low-precision
    group steps one parameter at a time: its slots are decoded to plain
    tensors, ``run`` gets a view of the optimizer (:func:`stepping_view`)
    whose only group is that parameter's, and the slots are encoded back,
    so at most one parameter's state is full precision at any moment and
    the optimizer's ``param_groups`` are never changed. A sharded
    (``DTensor``) parameter's slots are ``DTensor``s whose shards are
    quantized (blocks within the shard): the shard is decoded into a
    ``DTensor`` of the same placements, then encoded back.

    Args:
        optimizer: the optimizer, or a view of it.
        run: the update over the groups of the optimizer it is given.
        tables: the names of the slots taking the unsigned table without
            zero, the linear table, and low-rank factors.
        stored_step: tried first for each parameter of a low-precision group
            (with its group); when it returns True it has stepped that
            parameter on its stored state, which is then not decoded.
    """
    groups = optimizer.param_groups
    _decode_switched(optimizer, _checked_precisions(optimizer, groups), tables)
    low = [group for group in groups if group_precision(group) != "fp32"]
    if not low:
        run(optimizer)
        return
    full = [group for group in groups if group_precision(group) == "fp32"]
    if full:
        run(stepping_view(optimizer, full))
    for group in low:
        for index, param in enumerate(group["params"]):
            if param.grad is not None:
                view = stepping_view(optimizer, [_narrowed(group, index)])
                _step_one(view, param, run, tables, stored_step)


def step_in_state_precision(
    optimizer: torch.optim.Optimizer,
    step: Callable[[], Any],
    second_moments: frozenset[str] = SECOND_MOMENTS,
    fused_step: StoredStateStep | None = None,
    linear_slots: frozenset[str] = NO_SLOTS,
    low_rank_slots: frozenset[str] = NO_SLOTS,
) -> None:
    """Deprecated: :func:`run_in_state_precision` with a closure over ``optimizer.param_groups``.

    Kept for plugins written against it: ``step`` reads the optimizer's own
    ``param_groups``, so they are narrowed for each call and restored after.
    New code declares the state codec in its step pipeline
    (:data:`optiplug.base.state_codec`), which never changes them.
    """
    groups = optimizer.param_groups

    def run(view: Any) -> None:
        optimizer.param_groups = view.param_groups
        try:
            step()
        finally:
            optimizer.param_groups = groups

    run_in_state_precision(
        optimizer, run, (second_moments, linear_slots, low_rank_slots), fused_step
    )


STEPPED_PRECISIONS = "_optiplug_state_precisions"
"""The optimizer attribute holding its groups' precisions at the last step: while they
stay, no full-precision group can hold codes, and nothing is scanned."""


def _checked_precisions(
    optimizer: torch.optim.Optimizer, groups: Sequence[Mapping[str, Any]]
) -> tuple[str, ...]:
    """Every group's ``state_precision``, each one of :data:`STATE_PRECISIONS`.

    Raises:
        HyperparameterError: a group holds another value (a typo, or a
            precision set by hand after creation); nothing has run.
    """
    precisions = tuple(group_precision(group) for group in groups)
    for precision in precisions:
        if precision not in STATE_PRECISIONS:
            reason = f"must be one of {', '.join(STATE_PRECISIONS)}"
            algorithm = getattr(type(optimizer), "algorithm", None)
            name = algorithm if isinstance(algorithm, str) else type(optimizer).__name__
            raise HyperparameterError("state_precision", precision, reason, algorithm=name)
    return precisions


def _decode_switched(
    optimizer: torch.optim.Optimizer,
    precisions: tuple[str, ...],
    tables: tuple[frozenset[str], frozenset[str], frozenset[str]],
) -> None:
    """Decode the stored codes of full-precision groups when the groups' precisions changed.

    A group set to ``"fp32"`` after steps in a low precision (or state
    loaded or converted since the last step) may hold codes; its kernels
    take plain tensors only, so they are decoded before any kernel runs and
    a step never half-applies. While the precisions stay as they were at the
    last step, nothing is scanned.
    """
    origin = origin_of(optimizer)
    if getattr(origin, STEPPED_PRECISIONS, None) == precisions:
        return
    groups = optimizer.param_groups
    full = [
        p for g, kept in zip(groups, precisions, strict=True) if kept == "fp32" for p in g["params"]
    ]
    if full:
        convert_state(optimizer, full, *tables)
    setattr(origin, STEPPED_PRECISIONS, precisions)


def forget_precisions(optimizer: Any) -> None:
    """Make the next step look for stored codes again (its state was replaced or converted)."""
    vars(optimizer).pop(STEPPED_PRECISIONS, None)


def _narrowed(group: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A shallow copy of ``group`` holding only its ``index``-th parameter (and name)."""
    narrowed = {**group, "params": [group["params"][index]]}
    names = group.get("param_names")
    if isinstance(names, (list, tuple)) and len(names) == len(group["params"]):
        narrowed["param_names"] = [names[index]]
    return narrowed


def _step_one(
    view: Any,
    param: torch.Tensor,
    run: StepRun,
    tables: SlotTables,
    stored_step: StoredStateStep | None = None,
) -> None:
    """Step ``param`` alone (``view``'s only group) on its decoded slots; store them back."""
    if stored_step is not None and stored_step(view, view.param_groups[0], param):
        return
    state = view.state[param]
    stored = {k: v for k, v in state.items() if isinstance(local_of(v), QuantizedState)}
    for key, value in stored.items():
        state[key] = decoded(value)
    run(view)
    precision = group_precision(view.param_groups[0])
    for key, value in list(state.items()):
        if not _is_state_tensor(key, value, param):
            continue
        kept = stored.get(key)
        table = slot_table(key, precision, *tables)
        if kept is not None and _stored_in(local_of(kept), precision, *table):
            local_of(kept).store(local_of(value))
            state[key] = kept
        else:
            state[key] = _slot_in_precision(key, value, precision, *tables)
