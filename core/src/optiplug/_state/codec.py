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

The code lives in one module per concern, re-exported here (the path
plugins, tests and checkpoints name; the private helpers tests import
are re-exported by name too): the tables (:mod:`.tables`), blockwise
encoding and bf16 rounding (:mod:`.blockwise`), the factors
(:mod:`.low_rank`), the tensor (:mod:`.quantized`), sharded state
(:mod:`.dtensor`), slots in a precision (:mod:`.slots`) and stepping in it
(:mod:`.stepping`).
"""

from __future__ import annotations

from .blockwise import CHUNK, seed_term
from .blockwise import _codes as _codes
from .blockwise import _decode_blocks as _decode_blocks
from .blockwise import _encode_blocks as _encode_blocks
from .blockwise import _encode_blocks_torch as _encode_blocks_torch
from .dtensor import decoded, is_dtensor, local_of, sharded_like
from .low_rank import LOW_RANK, START_ITERATIONS
from .precision import BLOCK_SIZES
from .quantized import QuantizedState
from .quantized import _rebuilt as _rebuilt
from .slots import (
    LINEAR_SECOND_MOMENTS,
    MIN_QUANTIZED_NUMEL,
    NO_SLOTS,
    SECOND_MOMENTS,
    STEPPED_PRECISIONS,
    convert_state,
    forget_precisions,
    group_precision,
    in_precision,
    slot_table,
    state_in_precision,
)
from .stepping import (
    SlotTables,
    StepRun,
    StoredStateStep,
    origin_of,
    run_in_state_precision,
    step_in_state_precision,
    stepping_view,
)
from .tables import _magnitudes as _magnitudes
from .tables import _table as _table
from .tables import dynamic_table, linear_table

__all__ = [
    "BLOCK_SIZES",
    "CHUNK",
    "LINEAR_SECOND_MOMENTS",
    "LOW_RANK",
    "MIN_QUANTIZED_NUMEL",
    "NO_SLOTS",
    "QuantizedState",
    "SECOND_MOMENTS",
    "START_ITERATIONS",
    "STEPPED_PRECISIONS",
    "SlotTables",
    "StepRun",
    "StoredStateStep",
    "convert_state",
    "decoded",
    "dynamic_table",
    "forget_precisions",
    "group_precision",
    "in_precision",
    "is_dtensor",
    "linear_table",
    "local_of",
    "origin_of",
    "run_in_state_precision",
    "seed_term",
    "sharded_like",
    "slot_table",
    "state_in_precision",
    "step_in_state_precision",
    "stepping_view",
]
