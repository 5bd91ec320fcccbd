"""An elementwise optimizer's step on low-precision state, generated in C from its update.

A third-party elementwise optimizer gets what a first-party one has: one C pass per
parameter over the codec's blocks, each block's slots decoded into small
buffers, the update applied element by element, and the slots encoded back
(int8, int4) or rounded stochastically (bf16) with the codec's own tables
and bits, so the result equals decoding, updating and encoding the whole
tensors. The algorithm supplies only the update of one element, in C
(:class:`StateKernelSource`); :func:`build_state_kernel` wraps it in the
codec's loops (:mod:`.native_blocks`) and builds it with
:func:`optiplug.base.build_c_library`.

An optimizer with a C step of its own written around those loops (a
torch-backed one) declares it as its class's ``state_step``.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from .._native import NativeLibrary, build_c_library, library_when_ready
from .codec import QuantizedState, seed_term
from .native_blocks import CODEC_C_SOURCE, c_step_applies, codec_tables

__all__ = [
    "StateKernel",
    "StateKernelSource",
    "build_state_kernel",
    "state_kernel_or_none",
]


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED = frozenset({"param", "grad", "j", "count"})


def _c_names(names: Any, field: str) -> tuple[str, ...]:
    """``names`` as a tuple of distinct C identifiers (``slots``: at least one).

    Raises:
        ValueError: naming ``field`` and its value.
    """
    found = tuple(names)
    valid = all(isinstance(n, str) and _NAME.match(n) and n not in _RESERVED for n in found)
    if not valid or len(set(found)) != len(found) or (field == "slots" and not found):
        raise ValueError(
            f"StateKernelSource.{field}={found!r}: expected distinct C identifiers other than "
            f"{', '.join(sorted(_RESERVED))}" + (", at least one" if field == "slots" else "")
        )
    return found


def _slot_names(names: Any) -> tuple[str, ...]:
    return _c_names(names, "slots")


def _scalar_names(names: Any) -> tuple[str, ...]:
    return _c_names(names, "scalars")


@attrs.frozen
class StateKernelSource:
    """The update of one element, in C, of an elementwise optimizer's step.

    The body runs once per element with ``float param`` and ``const float
    grad`` in scope, one ``float`` variable per state slot named as the slot
    (its decoded value), and one ``const float`` per scalar; it assigns the
    new ``param`` and slot values. It is compiled as C11 with IEEE
    arithmetic (no fast-math, no contraction into fused multiply-adds unless
    written as ``fmaf``), so it rounds as the same float32 operations in
    torch do.

    Attributes:
        name: names the built library (kept per machine under the cache).
        update: the C statements.
        slots: the state slots it updates, in the order the step passes them.
        scalars: the per-step scalars it reads (floats), by name.
    """

    name: str
    update: str
    slots: tuple[str, ...] = attrs.field(converter=_slot_names)
    scalars: tuple[str, ...] = attrs.field(converter=_scalar_names)

    def c_source(self) -> str:
        """The complete C source: the codec's loops around :attr:`update`."""
        fields = "".join(f"  float {name};\n" for name in self.scalars) or "  float unused_;\n"
        scalars = "".join(f"  const float {name} = h->{name};\n" for name in self.scalars)
        pointers = ", ".join(f"float *restrict s{i}_" for i in range(len(self.slots)))
        load = "".join(f"    float {n} = s{i}_[j];\n" for i, n in enumerate(self.slots))
        store = "".join(f"    s{i}_[j] = {n};\n" for i, n in enumerate(self.slots))
        buffers = ", ".join(f"buf[{i}]" for i in range(len(self.slots)))
        return CODEC_C_SOURCE + _TEMPLATE.format(
            fields=fields, scalars=scalars, pointers=pointers, load=load, store=store,
            update=self.update, slots=len(self.slots), buffers=buffers,
        )  # fmt: skip


_TEMPLATE = r"""
typedef struct {{
{fields}}} optiplug_state_scalars;

static inline void state_update(float *restrict p_, const float *restrict g_, int count,
                                {pointers}, const optiplug_state_scalars *h) {{
{scalars}  for (int j = 0; j < count; j++) {{
    float param = p_[j];
    const float grad = g_[j];
{load}    {{
{update}
    }}
    p_[j] = param;
{store}  }}
}}

void optiplug_state_step(float *restrict p, const float *restrict g, int64_t n, int bits,
                         uint8_t *const *codes, float *const *scales, uint16_t *const *halves,
                         const uint32_t *seeds, const optiplug_codes *const *tables,
                         const optiplug_state_scalars *h, int threads) {{
  const int block = bits == 4 ? 128 : 256;  /* bits 16: bf16, blocks of 256 */
  const int64_t blocks = (n + block - 1) / block;
  #pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < blocks; b++) {{
    const int64_t start = b * block;
    const int count = (int)(n - start < block ? n - start : block);
    float buf[{slots}][256];
    for (int s = 0; s < {slots}; s++) {{
      if (bits == 16) {{
        for (int j = 0; j < count; j++) buf[s][j] = float_of((uint32_t)halves[s][start + j] << 16);
      }} else {{
        decode(codes[s] + start * bits / 8, bits, block, scales[s][b], tables[s], buf[s]);
      }}
    }}
    state_update(p + start, g + start, count, {buffers}, h);
    for (int s = 0; s < {slots}; s++) {{
      if (bits == 16) {{
        for (int j = 0; j < count; j++)
          halves[s][start + j] = bf16_rounded(buf[s][j], (uint32_t)(start + j), seeds[s]);
        continue;
      }}
      for (int j = count; j < block; j++) buf[s][j] = 0.0f;  /* the encoder's zero padding */
      scales[s][b] = block_scale(buf[s], block);
      encode(buf[s], bits, block, scales[s][b], tables[s], codes[s] + start * bits / 8);
    }}
  }}
}}
"""


class StateKernel:
    """A built :class:`StateKernelSource`: steps one parameter on its stored slots."""

    def __init__(self, source: StateKernelSource, library: Any) -> None:
        self.source = source
        self._scalars_type = type(
            "Scalars",
            (ctypes.Structure,),
            {"_fields_": [(n, ctypes.c_float) for n in source.scalars or ("unused_",)]},
        )
        pointer = ctypes.c_void_p
        self._step = library.function(
            "optiplug_state_step",
            [pointer, pointer, ctypes.c_int64, ctypes.c_int, pointer, pointer, pointer,
             pointer, pointer, ctypes.POINTER(self._scalars_type), ctypes.c_int],
        )  # fmt: skip

    def applies(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        slots: Sequence[Any],
        precision: str | None = None,
    ) -> bool:
        """Whether :meth:`step` can take these: float32 CPU tensors, slots stored alike.

        Every slot must be a :class:`~optiplug.base.QuantizedState` of
        ``param``'s shape in one precision (int8, int4 or bf16), laid out as
        the codec writes it.

        Args:
            param: the parameter.
            grad: its gradient.
            slots: the stored slots, in :attr:`StateKernelSource.slots` order.
            precision: the precision the slots must be stored in (a group's
                ``state_precision``: slots stored in another one are for the
                decoding path to convert); None takes the first slot's.
        """
        if len(slots) != len(self.source.slots) or not isinstance(slots[0], QuantizedState):
            return False
        wanted = slots[0].precision if precision is None else precision
        return c_step_applies(param, grad, slots, wanted)

    def step(
        self,
        param: torch.Tensor,
        grad: torch.Tensor,
        slots: Sequence[QuantizedState],
        scalars: Mapping[str, float],
    ) -> None:
        """Update ``param`` and ``slots`` in place (each slot's ``writes`` grows by one).

        Args:
            param: the parameter (what :meth:`applies` accepts).
            grad: its gradient.
            slots: the stored slots, in :attr:`StateKernelSource.slots` order.
            scalars: a float for every name of :attr:`StateKernelSource.scalars`.

        Raises:
            ValueError: tensors :meth:`applies` refuses, or scalars missing or extra.
        """
        if not self.applies(param, grad, slots):
            raise ValueError(f"{self.source.name}: these tensors cannot take the C state step")
        if set(scalars) != set(self.source.scalars):
            raise ValueError(f"{self.source.name}: scalars {sorted(scalars)} are not "
                             f"{sorted(self.source.scalars)}")  # fmt: skip
        tables = [codec_tables(slot.precision, slot.signed, slot.linear) for slot in slots]
        bits = tables[0].bits
        count = len(slots)
        empty = torch.empty(0)
        codes = [empty if bits == 16 else slot.codes for slot in slots]
        scales = [empty if bits == 16 else slot.scales for slot in slots]
        halves = [slot.codes if bits == 16 else empty for slot in slots]
        arrays = [(ctypes.c_void_p * count)(*(t.data_ptr() for t in kind))
                  for kind in (codes, scales, halves)]  # fmt: skip
        seeds = (ctypes.c_uint32 * count)(*(seed_term(slot.writes + 1) for slot in slots))
        table_pointers = (ctypes.c_void_p * count)(*(table.address for table in tables))
        values = self._scalars_type(**{name: float(scalars[name]) for name in self.source.scalars})
        self._step(
            param.data_ptr(), grad.data_ptr(), param.numel(), bits, *arrays, seeds,
            table_pointers, ctypes.byref(values), torch.get_num_threads(),
        )  # fmt: skip
        for slot in slots:
            slot.writes += 1


@functools.cache
def build_state_kernel(source: StateKernelSource) -> StateKernel:
    """``source`` built (once per process, kept per machine).

    Args:
        source: the update and the slots and scalars it names.

    Returns:
        The kernel.

    Raises:
        NativeBuildError: no C compiler, a failed build (the compiler's
            message names the line of the update), or ``OPTIPLUG_NATIVE=0``.
            An optimizer then steps through the codec's decode-step-encode
            path (:func:`state_kernel_or_none`).
    """
    return _kernel_of(source, build_c_library(_c_source(source), name=source.name))


def state_kernel_or_none(source: StateKernelSource, *, wait: bool = True) -> StateKernel | None:
    """:func:`build_state_kernel`, or None where it cannot be built (yet).

    The build is tried once per process (a failure warns once); a training
    step passes ``wait=False``, which starts the build in a background thread
    and returns None until it is loaded, so the step runs the decoding path
    meanwhile and never waits for the compiler.

    Args:
        source: the update and the slots and scalars it names.
        wait: wait for the build (True), or return None while it runs.
    """
    library = library_when_ready(_c_source(source), name=source.name, wait=wait)
    return None if library is None else _kernel_of(source, library)


@functools.cache
def _c_source(source: StateKernelSource) -> str:
    """``source.c_source()``, generated once (its hash is then kept for the lookups)."""
    return source.c_source()


@functools.cache
def _kernel_of(source: StateKernelSource, library: NativeLibrary) -> StateKernel:
    return StateKernel(source, library)


state_kernel_or_none.__module__ = "optiplug.base"  # public there (the plugin toolkit)
