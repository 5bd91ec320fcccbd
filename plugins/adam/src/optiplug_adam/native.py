"""Adam and AdamW steps on int8, int4 or bf16 state in one C pass over the blocks.

:func:`fused_adam_step` updates one float32 parameter whose ``exp_avg`` and
``exp_avg_sq`` are int8 or int4 :class:`~optiplug.base.QuantizedState`
slots without decoding them to whole tensors: each block of the codec (256
elements for int8, 128 for int4) is decoded into a small float buffer, the
step of torch's single-tensor Adam is applied to the parameter and both
moments, the block's new absolute maxima are taken and the moments are
encoded back into their codes and scales in place. Everything a block needs
stays in L1, and each loop over a block vectorizes; with AVX-512 the int8
and int4 tables are looked up in registers (permutes) rather than gathered.

The codes follow the codec's decade rule exactly: the block loops
(decoding, block scales, encoding, bf16 rounding) are the codec's own,
:data:`optiplug.base.CODEC_C_SOURCE`, which every C state step shares.

The arithmetic is float32 per element with the scalars computed in double,
as torch's ``_single_tensor_adam`` does, and rounds as ATen's vectorized
CPU loops do: ``lerp``, ``add(alpha=)`` and ``addcmul`` with fused
multiply-adds (``fmaf``) where ATen has them, everything else without
contraction. That is torch's single-tensor step bit for bit except where
ATen's vectorized ``sqrt`` is not correctly rounded (torch 2.13's AVX-512
one is off by an ulp for some inputs; ``sqrt`` here is IEEE's), and within
a few ulps of torch's ``fused=True`` kernel. OpenMP splits the blocks over
torch's intra-op thread count.

bf16 moments take the same pass over blocks of 256 elements: decoded by a
shift, stepped by the same arithmetic, and rounded stochastically on write
with the codec's hashed bits (:func:`optiplug.base.seed_term`), the same
bits its torch path draws for that write.

``Adam`` and ``optiplug_adamw``'s ``AdamW`` declare :func:`fused_adam_step`
as their ``state_step``.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from optiplug.base import (
    CODEC_C_SOURCE,
    NativeLibrary,
    QuantizedState,
    c_library_or_none,
    c_step_applies,
    codec_tables,
    group_precision,
    seed_term,
)

__all__ = ["NativeAdam", "fused_adam_step", "native_adam"]

_SOURCE = (
    CODEC_C_SOURCE
    + r"""
typedef struct {
  float neg_step, bc2_sqrt, eps, weight1, beta2, one_minus_beta2, l2, decay;
  int32_t maximize, use_l2, use_decay;
} optiplug_adam;

/* sqrtf of a block (a multiple of 16) in vector instructions: a loop calling sqrtf is not
   vectorized by GCC while sqrtf may set errno. The same correctly rounded square roots. */
static inline void sqrt_block(const float *restrict x, float *restrict out, int block) {
#if defined(__AVX512F__)
  for (int j = 0; j < block; j += 16)
    _mm512_storeu_ps(out + j, _mm512_sqrt_ps(_mm512_loadu_ps(x + j)));
#elif defined(__AVX__)
  for (int j = 0; j < block; j += 8)
    _mm256_storeu_ps(out + j, _mm256_sqrt_ps(_mm256_loadu_ps(x + j)));
#elif defined(__SSE2__)
  for (int j = 0; j < block; j += 4) _mm_storeu_ps(out + j, _mm_sqrt_ps(_mm_loadu_ps(x + j)));
#else
  for (int j = 0; j < block; j++) out[j] = sqrtf(x[j]);
#endif
}

static inline void update(float *restrict p, const float *restrict g, int count, int block,
                          float *restrict m, float *restrict v, const optiplug_adam *h) {
  const float w = h->weight1, w_less = h->weight1 - 1.0f, l2 = h->l2, decay = h->decay;
  const float beta2 = h->beta2, rest2 = h->one_minus_beta2, bc2 = h->bc2_sqrt, eps = h->eps;
  const float neg_step = h->neg_step;
  const int small = w < 0.5f, maximize = h->maximize, use_l2 = h->use_l2;
  const int use_decay = h->use_decay;
  for (int j = 0; j < count; j++) {
    float grad = maximize ? -g[j] : g[j];
    float param = p[j];
    grad = use_l2 ? fmaf(param, l2, grad) : grad;
    param = use_decay ? param * decay : param;
    const float diff = grad - m[j];
    const float mj = small ? fmaf(w, diff, m[j]) : fmaf(w_less, diff, grad);
    m[j] = mj;
    v[j] = fmaf(rest2 * grad, grad, v[j] * beta2);
    p[j] = param;
  }
  float root[256];
  sqrt_block(v, root, block);
  for (int j = 0; j < count; j++) p[j] = p[j] + neg_step * m[j] / (root[j] / bc2 + eps);
}

#if defined(__AVX512F__)
/* update() and both block_scale()s of a whole block in one pass, 16 elements at a time: the
   same operations in the same order (the square root inline), the moments' absolute maxima
   taken on the way. */
static inline void update_whole_block(float *restrict p, const float *restrict g, int block,
                                      float *restrict m, float *restrict v, const optiplug_adam *h,
                                      float *m_scale, float *v_scale) {
  const __m512 w = _mm512_set1_ps(h->weight1), w_less = _mm512_set1_ps(h->weight1 - 1.0f);
  const __m512 l2 = _mm512_set1_ps(h->l2), decay = _mm512_set1_ps(h->decay);
  const __m512 beta2 = _mm512_set1_ps(h->beta2), rest2 = _mm512_set1_ps(h->one_minus_beta2);
  const __m512 bc2 = _mm512_set1_ps(h->bc2_sqrt), eps = _mm512_set1_ps(h->eps);
  const __m512 neg_step = _mm512_set1_ps(h->neg_step);
  const __m512i sign = _mm512_set1_epi32((int32_t)0x80000000u), magnitude = _mm512_set1_epi32(0x7fffffff);
  const int small = h->weight1 < 0.5f, maximize = h->maximize, use_l2 = h->use_l2;
  const int use_decay = h->use_decay;
  __m512i m_top = _mm512_setzero_si512(), v_top = _mm512_setzero_si512();
  for (int j = 0; j < block; j += 16) {
    __m512 grad = _mm512_loadu_ps(g + j), param = _mm512_loadu_ps(p + j);
    if (maximize) grad = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(grad), sign));
    if (use_l2) grad = _mm512_fmadd_ps(param, l2, grad);
    if (use_decay) param = _mm512_mul_ps(param, decay);
    const __m512 old = _mm512_loadu_ps(m + j), diff = _mm512_sub_ps(grad, old);
    const __m512 mj = small ? _mm512_fmadd_ps(w, diff, old) : _mm512_fmadd_ps(w_less, diff, grad);
    const __m512 vj = _mm512_fmadd_ps(_mm512_mul_ps(rest2, grad), grad,
                                      _mm512_mul_ps(_mm512_loadu_ps(v + j), beta2));
    _mm512_storeu_ps(m + j, mj);
    _mm512_storeu_ps(v + j, vj);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vj), bc2), eps);
    _mm512_storeu_ps(p + j, _mm512_add_ps(param, _mm512_div_ps(_mm512_mul_ps(neg_step, mj), denom)));
    m_top = _mm512_max_epu32(m_top, _mm512_and_si512(_mm512_castps_si512(mj), magnitude));
    v_top = _mm512_max_epu32(v_top, _mm512_and_si512(_mm512_castps_si512(vj), magnitude));
  }
  *m_scale = scale_of_top((uint32_t)_mm512_reduce_max_epu32(m_top));
  *v_scale = scale_of_top((uint32_t)_mm512_reduce_max_epu32(v_top));
}
#endif

static inline void adam_block(float *restrict p, const float *restrict g, int count, int bits,
                              int block, uint8_t *restrict m_codes, float *restrict m_scale,
                              uint8_t *restrict v_codes, float *restrict v_scale,
                              const optiplug_codes *mc, const optiplug_codes *vc,
                              const optiplug_adam *h) {
  float m[256], v[256];
  decode(m_codes, bits, block, *m_scale, mc, m);
  decode(v_codes, bits, block, *v_scale, vc, v);
#if defined(__AVX512F__)
  if (count == block) {
    update_whole_block(p, g, block, m, v, h, m_scale, v_scale);
  } else
#endif
  {
    update(p, g, count, block, m, v, h);
    for (int j = count; j < block; j++) m[j] = v[j] = 0.0f;  /* the encoder's zero padding */
    *m_scale = block_scale(m, block);
    *v_scale = block_scale(v, block);
  }
  encode(m, bits, block, *m_scale, mc, m_codes);
  encode(v, bits, block, *v_scale, vc, v_codes);
}

void optiplug_adam_encode(const float *restrict x, int64_t n, int bits, uint8_t *restrict codes,
                          float *restrict scales, const optiplug_codes *c, int threads) {
  const int block = bits == 8 ? 256 : 128;
  const int64_t blocks = (n + block - 1) / block;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * block;
    const int count = (int)(n - start < block ? n - start : block);
    float values[256];
    for (int j = 0; j < block; j++) values[j] = j < count ? x[start + j] : 0.0f;
    scales[b] = block_scale(values, block);
    encode(values, bits, block, scales[b], c, codes + start * bits / 8);
  }
}

void optiplug_adam_bf16_step(float *restrict p, const float *restrict g, int64_t n,
                             uint16_t *restrict m16, uint16_t *restrict v16, uint32_t m_seed,
                             uint32_t v_seed, const optiplug_adam *h, int threads) {
  const int64_t blocks = (n + 255) / 256;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * 256;
    const int count = (int)(n - start < 256 ? n - start : 256);
    float m[256], v[256];
    for (int j = 0; j < 256; j++) {
      m[j] = j < count ? float_of((uint32_t)m16[start + j] << 16) : 0.0f;
      v[j] = j < count ? float_of((uint32_t)v16[start + j] << 16) : 0.0f;
    }
    update(p + start, g + start, count, 256, m, v, h);
    for (int j = 0; j < count; j++) {
      m16[start + j] = bf16_rounded(m[j], (uint32_t)(start + j), m_seed);
      v16[start + j] = bf16_rounded(v[j], (uint32_t)(start + j), v_seed);
    }
  }
}

void optiplug_adam_step(float *restrict p, const float *restrict g, int64_t n, int bits,
                        uint8_t *restrict m_codes, float *restrict m_scales,
                        uint8_t *restrict v_codes, float *restrict v_scales,
                        const optiplug_codes *mc, const optiplug_codes *vc,
                        const optiplug_adam *h, int threads) {
  const int block = bits == 8 ? 256 : 128;
  const int64_t blocks = (n + block - 1) / block;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t start = b * block;
    const int count = (int)(n - start < block ? n - start : block);
    const int64_t bytes = start * bits / 8;
    if (bits == 8)
      adam_block(p + start, g + start, count, 8, 256, m_codes + bytes, m_scales + b,
                 v_codes + bytes, v_scales + b, mc, vc, h);
    else
      adam_block(p + start, g + start, count, 4, 128, m_codes + bytes, m_scales + b,
                 v_codes + bytes, v_scales + b, mc, vc, h);
  }
}
"""
)
"""The codec's block loops and Adam's step around them."""


class _Scalars(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_float) for name in ("neg_step", "bc2_sqrt", "eps", "weight1", "beta2")),
        *((name, ctypes.c_float) for name in ("one_minus_beta2", "l2", "decay")),
        *((name, ctypes.c_int32) for name in ("maximize", "use_l2", "use_decay")),
    ]


_POINTER = ctypes.c_void_p
_ENCODE_ARGS: list[Any] = [_POINTER, ctypes.c_int64, ctypes.c_int, _POINTER, _POINTER,
                           _POINTER, ctypes.c_int]  # fmt: skip
_BF16_STEP_ARGS: list[Any] = [_POINTER, _POINTER, ctypes.c_int64, _POINTER, _POINTER,
                              ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(_Scalars),
                              ctypes.c_int]  # fmt: skip
_STEP_ARGS: list[Any] = [_POINTER, _POINTER, ctypes.c_int64, ctypes.c_int, _POINTER, _POINTER,
                         _POINTER, _POINTER, _POINTER, _POINTER,
                         ctypes.POINTER(_Scalars), ctypes.c_int]  # fmt: skip


class NativeAdam:
    """The loaded C step (see the module docstring)."""

    def __init__(self, library: NativeLibrary) -> None:
        self._step = library.function("optiplug_adam_step", _STEP_ARGS)
        self._bf16_step = library.function("optiplug_adam_bf16_step", _BF16_STEP_ARGS)
        self._encode = library.function("optiplug_adam_encode", _ENCODE_ARGS)

    def encode(
        self, flat: torch.Tensor, precision: str, signed: bool, linear: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The codes and scales of contiguous float32 ``flat`` by the step's own encoder.

        The codec's encoding computes the same, bit for bit; this entry point
        lets that be checked.

        Args:
            flat: a contiguous one-dimensional float32 CPU tensor.
            precision: ``"int8"`` or ``"int4"``.
            signed: the signed table (a first moment) or not.
            linear: the linear table of that kind instead of the dynamic one.

        Returns:
            ``(codes, scales)`` laid out as :class:`QuantizedState` keeps them.
        """
        tables = codec_tables(precision, signed, linear)
        bits, block = tables.bits, tables.block
        blocks = -(-flat.numel() // block)
        codes = torch.empty(blocks * block * bits // 8, dtype=torch.uint8)
        scales = torch.empty(blocks, dtype=torch.float32)
        self._encode(
            flat.data_ptr(), flat.numel(), bits, codes.data_ptr(), scales.data_ptr(),
            tables.address, torch.get_num_threads(),
        )  # fmt: skip
        return codes, scales

    def step(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        slots: tuple[QuantizedState, QuantizedState],
        scalars: dict[str, float],
    ) -> None:
        """One step on contiguous float32 ``param`` and ``grad``, moments ``slots`` in place.

        Args:
            param: the parameter, updated in place.
            grad: its gradient.
            slots: ``(exp_avg, exp_avg_sq)``, both int8, both int4 or both bf16
                (whose values are rounded stochastically with the seeds their
                next write takes).
            scalars: the fields of the C structure of the step's scalars.
        """
        exp_avg, exp_avg_sq = slots
        if exp_avg.precision == "bf16":
            self._bf16_step(
                param.data_ptr(), grad.data_ptr(), param.numel(),
                exp_avg.codes.data_ptr(), exp_avg_sq.codes.data_ptr(),
                seed_term(exp_avg.writes + 1), seed_term(exp_avg_sq.writes + 1),
                ctypes.byref(_Scalars(**scalars)), torch.get_num_threads(),
            )  # fmt: skip
            return
        first = codec_tables(exp_avg.precision, True, exp_avg.linear)
        second = codec_tables(exp_avg.precision, False, exp_avg_sq.linear)
        bits = first.bits
        self._step(
            param.data_ptr(), grad.data_ptr(), param.numel(), bits,
            exp_avg.codes.data_ptr(), exp_avg.scales.data_ptr(),
            exp_avg_sq.codes.data_ptr(), exp_avg_sq.scales.data_ptr(),
            first.address, second.address,
            ctypes.byref(_Scalars(**scalars)), torch.get_num_threads(),
        )  # fmt: skip


def native_adam(wait: bool = True) -> NativeAdam | None:
    """The C step, built once per process; None without a C compiler or with it switched off.

    Args:
        wait: wait for the build (True); with False, None while it builds in
            a background thread (what a training step asks: it runs the
            decode-step-encode path meanwhile, into the same state layout).
    """
    library = c_library_or_none(_SOURCE, "optiplug-adam", wait=wait)
    return None if library is None else _adam_of(library)


@functools.cache
def _adam_of(library: NativeLibrary) -> NativeAdam:
    return NativeAdam(library)


def fused_adam_step(optimizer: torch.optim.Optimizer, group: dict[str, Any], param: Any) -> bool:
    """One Adam/AdamW step of ``param`` on its int8/int4/bf16 moments in place, when the C step applies.

    The step is torch's single-tensor one (``maximize``, L2 weight decay for
    Adam, decoupled for AdamW, bias corrections from the incremented
    ``state["step"]``); both slots' ``writes`` grow by one, as a store does.

    Args:
        optimizer: a ``torch.optim.Adam`` (or ``AdamW``) whose state is low precision.
        group: ``param``'s group (its hyperparameters are read).
        param: the parameter, with a gradient.

    Returns:
        False, having changed nothing, when the C step does not apply (the
        group's implementation is not ``fused``, not a float32 CPU parameter with a dense contiguous gradient, an option
        it lacks, state not yet int8/int4/bf16 moments of the group's precision,
        no compiler, or the C step still building in the background); True
        when it stepped.
    """
    if torch.compiler.is_compiling() or not _plain_group(optimizer, group):
        return False
    state = optimizer.state.get(param)
    slots = _moments(state, group, param) if state else None
    if state is None or slots is None:
        return False
    # built on first need (after the codec's, which the first step's encoding asks for first)
    kernel = native_adam(wait=False)  # None while it builds: the torch path steps
    if kernel is None:
        return False
    step = _incremented(state)
    kernel.step(param, param.grad, slots, _scalars(optimizer, group, step))
    for slot in slots:
        slot.writes += 1
    return True


def _plain_group(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether ``group`` runs the fused implementation with options the C step has.

    The C step is ``impl="fused"``'s kernel for low-precision state; ``loop``
    and ``foreach`` keep torch's own arithmetic on the decoded state.
    """
    if not group.get("fused"):
        return False
    if group.get("amsgrad") or group.get("differentiable") or group.get("capturable"):
        return False
    if getattr(optimizer, "grad_scale", None) is not None:
        return False
    if getattr(optimizer, "found_inf", None) is not None:
        return False
    betas = group.get("betas", ())
    scalars = [group.get("lr"), group.get("eps"), group.get("weight_decay"), *betas]
    return len(betas) == 2 and all(isinstance(value, (int, float)) for value in scalars)


def _moments(
    state: dict[str, Any], group: dict[str, Any], param: torch.Tensor
) -> tuple[QuantizedState, QuantizedState] | None:
    """``(exp_avg, exp_avg_sq)`` when the C step can take them and ``param``, else None."""
    grad = param.grad
    first, second = state.get("exp_avg"), state.get("exp_avg_sq")
    if "step" not in state or grad is None:
        return None
    if not c_step_applies(param, grad, (first, second), group_precision(group), (True, False)):
        return None
    assert isinstance(first, QuantizedState) and isinstance(second, QuantizedState)
    return first, second


def _incremented(state: dict[str, Any]) -> float:
    """``state["step"]`` plus one, in place as torch keeps it (a tensor), and its new value."""
    step = state["step"]
    if isinstance(step, torch.Tensor):
        step += 1
        return float(step.item())
    state["step"] = step + 1
    return float(state["step"])


def _scalars(
    optimizer: torch.optim.Optimizer, group: dict[str, Any], step: float
) -> dict[str, Any]:
    """The C step's scalars, computed in double as torch's single-tensor Adam does."""
    lr, eps, decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
    beta1, beta2 = (float(beta) for beta in group["betas"])
    decoupled = bool(group.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW)))
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    return {
        "neg_step": -(lr / bias_correction1),
        "bc2_sqrt": bias_correction2**0.5,
        "eps": eps,
        "weight1": 1 - beta1,
        "beta2": beta2,
        "one_minus_beta2": 1 - beta2,
        "l2": decay,
        "decay": 1 - lr * decay,
        "maximize": int(bool(group.get("maximize"))),
        "use_l2": int(decay != 0 and not decoupled),
        "use_decay": int(decay != 0 and decoupled),
    }
