"""The optimizers of ``bitsandbytes.optim`` as a static table (torch-free, bitsandbytes-free).

Written from the installed bitsandbytes (class signatures and defaults, and
what each constructor passes on to the shared step): a family of classes
shares one parameter list, and each class of the family differs in which
keywords it names, how many bits its state takes and whether it pages. The
value ranges (``check``) follow bitsandbytes' own argument checks,
tightened where a value it accepts is ignored or fails at the first step
(``SGD(momentum=0)`` raises ``NotImplementedError`` when stepping;
``Adam(amsgrad=True)`` silently runs plain Adam). A test compares this
table with the installed classes, so an upgrade that changes a signature or
a default fails loudly.
"""

from __future__ import annotations

from typing import Any

import attrs

from optiplug import StateSlot

__all__ = [
    "CATALOG",
    "LIBRARY",
    "LIBRARY_VERSION",
    "REQUIRED",
    "Entry",
    "Param",
    "entry",
]

LIBRARY = "bitsandbytes"
LIBRARY_VERSION = "0.50.2"
"""The bitsandbytes release this table was generated from and tested against."""

BLOCK_SIZE = 256
"""Elements per absmax scale of bitsandbytes' blockwise 8-bit state."""

QMAP_ENTRIES = 256
"""Entries of a quantization map (one float32 value per 8-bit code)."""


class _Required:
    """The default of a keyword the class requires (``SGD``'s and ``LARS``'s ``lr``)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()


@attrs.frozen
class Param:
    """One constructor keyword of a library class.

    Attributes:
        name: the keyword.
        default: its default in the class signature (:data:`REQUIRED` if none).
        check: the range, a key of :data:`optiplug_bitsandbytes.config.CHECKS`,
            or ``"fixed"``: only the default is accepted.
        reason: why a ``"fixed"`` keyword takes its default only.
    """

    name: str
    default: Any
    check: str
    reason: str = ""


@attrs.frozen
class Entry:
    """One bridged class.

    Attributes:
        name: the registered name, the class name lower-cased
            (``PagedAdamW8bit`` is ``pagedadamw8bit``), as the other bridges
            name theirs.
        cls: the class name in ``bitsandbytes.optim``.
        module: the module defining it.
        params: its constructor keywords, in signature order (``params`` excluded).
        bits: the state's bits: ``8``, ``32``, or ``0`` when ``optim_bits`` decides.
        paged: whether it asks for paged state (on CUDA: unified memory).
        state: the per-parameter state it keeps.
        paper: the paper its docstrings cite ("" if none).
        description: one paragraph for ``optiplug show``.
        limitation: why it cannot run under optiplug ("" if it can).
    """

    name: str
    cls: str
    module: str
    params: tuple[Param, ...]
    bits: int
    paged: bool
    state: tuple[StateSlot, ...]
    paper: str
    description: str
    limitation: str = ""

    @property
    def target(self) -> str:
        """``"module:Class"`` of the library class."""
        return f"{self.module}:{self.cls}"


# ------------------------------------------------------------------ keywords
_AMSGRAD = "bitsandbytes implements no AMSGrad (its Adam ignores the flag, Adam8bit refuses it)"
_ARGS = "an args object replaces every keyword unchecked; pass the keywords themselves"
_OPTIM_BITS_FIXED = "the class fixes its state's bits; the keyword exists for compatibility"
_IGNORED = "bitsandbytes' step ignores it (the shared kernel has no such option)"
_LAMB8_UNORM = "LAMB8bit refuses any other value"
_ADAGRAD = "bitsandbytes' Adagrad refuses any other value"


def _lr(default: Any) -> Param:
    return Param("lr", default, "lr" if default is not REQUIRED else "lr_required")


def _tail(bits: int, *, paged_keyword: bool, optim_bits: str = "optim_bits") -> tuple[Param, ...]:
    """``optim_bits`` (where named), ``args``, ``min_8bit_size``, ``is_paged`` (where named)."""
    named: list[Param] = []
    if optim_bits == "optim_bits":
        named.append(Param("optim_bits", 32, "optim_bits"))
    elif optim_bits == "fixed32":
        named.append(Param("optim_bits", 32, "fixed", _OPTIM_BITS_FIXED))
    elif optim_bits == "fixed8":
        named.append(Param("optim_bits", 8, "fixed", _OPTIM_BITS_FIXED))
    named += [Param("args", None, "fixed", _ARGS), Param("min_8bit_size", 4096, "size")]
    if paged_keyword:
        named.append(Param("is_paged", False, "bool"))
    return tuple(named)


def _adam(decay: float, bits: int, *, paged_keyword: bool) -> tuple[Param, ...]:
    bits_keyword = "fixed32" if bits else "optim_bits"
    return (
        _lr(1e-3),
        Param("betas", (0.9, 0.999), "betas"),
        Param("eps", 1e-8, "eps"),
        Param("weight_decay", decay, "non_negative"),
        Param("amsgrad", False, "fixed", _AMSGRAD),
        *_tail(bits, paged_keyword=paged_keyword, optim_bits=bits_keyword),
    )


def _lion(bits: int, *, paged_keyword: bool) -> tuple[Param, ...]:
    return (
        _lr(1e-4),
        Param("betas", (0.9, 0.99), "betas"),
        Param("weight_decay", 0, "non_negative"),
        *_tail(bits, paged_keyword=paged_keyword, optim_bits="optim_bits" if bits == 0 else ""),
    )


def _lamb(bits: int) -> tuple[Param, ...]:
    return (
        _lr(1e-3),
        Param("bias_correction", True, "fixed", _IGNORED),
        Param("betas", (0.9, 0.999), "betas"),
        Param("eps", 1e-8, "eps"),
        Param("weight_decay", 0, "non_negative"),
        Param("amsgrad", False, "fixed", _AMSGRAD),
        Param("adam_w_mode", True, "fixed", _IGNORED),
        *_tail(bits, paged_keyword=False, optim_bits="optim_bits" if bits == 0 else ""),
        Param("max_unorm", 1.0, "fixed" if bits == 8 else "non_negative", _LAMB8_UNORM),
    )


def _momentum_family(bits: int, *, lars: bool) -> tuple[Param, ...]:
    own = (
        _lr(REQUIRED),
        Param("momentum", 0, "momentum_required"),
        Param("dampening", 0, "non_negative"),
        Param("weight_decay", 0, "non_negative"),
        Param("nesterov", False, "fixed", _IGNORED),
    )
    tail = _tail(bits, paged_keyword=False, optim_bits="optim_bits" if bits == 0 else "")
    return (*own, *tail, *((Param("max_unorm", 0.02, "non_negative"),) if lars else ()))


def _rmsprop(bits: int) -> tuple[Param, ...]:
    return (
        _lr(1e-2),
        Param("alpha", 0.99, "smoothing"),
        Param("eps", 1e-8, "eps"),
        Param("weight_decay", 0, "non_negative"),
        Param("momentum", 0, "momentum"),
        Param("centered", False, "fixed", "bitsandbytes' RMSprop refuses centered=True"),
        *_tail(bits, paged_keyword=False, optim_bits="optim_bits" if bits == 0 else ""),
    )


def _adagrad(bits: int) -> tuple[Param, ...]:
    bits_keyword = {0: "optim_bits", 32: "fixed32", 8: "fixed8"}[bits]
    return (
        _lr(1e-2),
        Param("lr_decay", 0, "fixed", _ADAGRAD),
        Param("weight_decay", 0, "non_negative"),
        Param("initial_accumulator_value", 0, "fixed", _ADAGRAD),
        Param("eps", 1e-10, "eps"),
        *_tail(bits, paged_keyword=False, optim_bits=bits_keyword),
    )


def _ademamix(bits: int, *, paged_keyword: bool) -> tuple[Param, ...]:
    own = (
        _lr(1e-3),
        Param("betas", (0.9, 0.999, 0.9999), "betas"),
        Param("alpha", 5.0, "non_negative"),
        Param("t_alpha", None, "optional_steps"),
        Param("t_beta3", None, "optional_steps"),
        Param("eps", 1e-8, "eps"),
        Param("weight_decay", 1e-2, "non_negative"),
    )
    bits_keyword = (Param("optim_bits", 32, "optim_bits"),) if bits == 0 else ()
    paged = (Param("is_paged", False, "bool"),) if paged_keyword else ()
    return (*own, *bits_keyword, Param("min_8bit_size", 4096, "size"), *paged)


# ------------------------------------------------------------------ state
def _codes(index: int, text: str) -> tuple[StateSlot, ...]:
    """``state<i>`` and, for a parameter kept in 8 bits, its ``qmap<i>`` and ``absmax<i>``."""
    return (
        StateSlot(
            f"state{index}",
            shape="any",
            dtype="any",
            description=f"{text}: uint8 codes (8-bit state) or float32 (32-bit state, and "
            "parameters below min_8bit_size elements); AdEMAMix stacks its two first moments",
        ),
        StateSlot(
            f"qmap{index}",
            shape="any",
            dtype="float32",
            optional=True,
            description=f"the 256-entry quantization map of state{index} (8-bit state only)",
        ),
        StateSlot(
            f"absmax{index}",
            shape="any",
            dtype="float32",
            constraints=("finite", "non_negative"),
            optional=True,
            description=f"one float32 scale per block of 256 elements of state{index} "
            "(8-bit state only)",
        ),
    )


_STEP = StateSlot(
    "step",
    shape="scalar",
    kind="number",
    constraints=("finite", "non_negative", "integral"),
    description="steps taken (a Python int)",
)
_UNORM = StateSlot(
    "unorm_vec",
    shape="any",
    dtype="float32",
    constraints=("finite", "non_negative"),
    optional=True,
    description="the update norm of the last step (when max_unorm > 0: LAMB, LARS)",
)

_STATE: dict[str, tuple[StateSlot, ...]] = {
    "adam": (_STEP, *_codes(1, "first moment"), *_codes(2, "second moment")),
    "lion": (_STEP, *_codes(1, "momentum")),
    "lamb": (_STEP, *_codes(1, "first moment"), *_codes(2, "second moment"), _UNORM),
    "lars": (_STEP, *_codes(1, "momentum"), _UNORM),
    "sgd": (_STEP, *_codes(1, "momentum")),
    "rmsprop": (_STEP, *_codes(1, "running mean of squared gradients")),
    "adagrad": (_STEP, *_codes(1, "sum of squared gradients")),
    "ademamix": (_STEP, *_codes(1, "fast and slow first moments"), *_codes(2, "second moment")),
    "torch_lars": (StateSlot("momentum_buffer", description="momentum (torch's layout)"),),
}


# ------------------------------------------------------------------ entries
_PAPER_8BIT = "https://arxiv.org/abs/2110.02861"
_PAPERS = {
    "lion": "https://arxiv.org/abs/2302.06675",
    "lamb": "https://arxiv.org/abs/1904.00962",
    "lars": "https://arxiv.org/abs/1708.03888",
    "ademamix": "https://arxiv.org/abs/2409.03137",
}
_ALGORITHMS = {
    "adam": "Adam (L2 weight decay)",
    "adamw": "AdamW (decoupled weight decay)",
    "lion": "Lion (sign of an interpolated momentum)",
    "lamb": "LAMB (Adam with a layer-wise trust ratio, capped by max_unorm)",
    "lars": "LARS (momentum SGD with a layer-wise trust ratio, capped by max_unorm)",
    "sgd": "SGD with momentum (momentum > 0: bitsandbytes has no plain SGD)",
    "rmsprop": "RMSprop",
    "adagrad": "Adagrad",
    "ademamix": "AdEMAMix (a fast and a slow first-moment average)",
}
_PAGED_NOTE = (
    " Paged: on CUDA, state of >= 100000 elements lives in unified memory that the driver "
    "pages to host memory under pressure; on a CPU bitsandbytes pages nothing (it warns once "
    "and keeps ordinary tensors), so it steps exactly as the unpaged class."
)
_BROKEN_ADEMAMIX32 = (
    "bitsandbytes {version}'s {cls} allocates one first-moment buffer where the AdEMAMix step "
    "needs two, so its first step fails on every parameter ('output with shape ... doesn't "
    "match the broadcast shape'); use bitsandbytes:{working} (optim_bits=32), the same "
    "algorithm with 32-bit state"
)


def _text(family: str, bits: int, paged: bool) -> str:
    state = {
        8: "8-bit blockwise state (dynamic quantization map, one absmax per 256 elements; "
        "parameters below min_8bit_size elements keep float32 state)",
        32: "float32 state",
        0: "float32 state, or 8-bit blockwise state with optim_bits=8",
    }[bits]
    step = " One fused bitsandbytes kernel per parameter."
    return f"bitsandbytes' {_ALGORITHMS[family]} with {state}.{step}" + (
        _PAGED_NOTE if paged else ""
    )


def _make(cls: str, family: str, module: str, params: tuple[Param, ...], **kw: Any) -> Entry:
    bits = 8 if cls.endswith("8bit") else 32 if cls.endswith("32bit") else kw.pop("bits", 0)
    paged = cls.startswith("Paged")
    state_family = "adam" if family == "adamw" else family
    paper = _PAPERS.get(family, "")
    return Entry(
        name=cls.lower(),
        cls=cls,
        module=f"bitsandbytes.optim.{module}",
        params=params,
        bits=bits,
        paged=paged,
        state=_STATE[state_family],
        paper=_PAPER_8BIT if bits == 8 and not paper else paper,
        description=_text(family, bits, paged),
        limitation=kw.pop("limitation", ""),
    )


def _variants(family: str, module: str, build: Any, *, pageable: bool) -> list[Entry]:
    """The base class and its 8-bit and 32-bit classes; with ``pageable`` their paged ones."""
    base = {"adamw": "AdamW", "adam": "Adam", "lion": "Lion", "ademamix": "AdEMAMix"}.get(
        family, family.upper() if family in ("lamb", "lars", "sgd") else family.title()
    )
    base = {"rmsprop": "RMSprop", "adagrad": "Adagrad"}.get(family, base)
    found: list[Entry] = []
    for prefix in ("", "Paged") if pageable else ("",):
        for suffix, bits in (("", 0), ("8bit", 8), ("32bit", 32)):
            cls = f"{prefix}{base}{suffix}"
            found.append(_make(cls, family, module, build(bits, cls)))
    return found


def _adam_build(decay: float) -> Any:
    def build(bits: int, cls: str) -> tuple[Param, ...]:
        keyword = not (cls.startswith("PagedAdamW"))  # PagedAdam* name is_paged; PagedAdamW* not
        return _adam(decay, bits, paged_keyword=keyword)

    return build


def _lion_build(bits: int, cls: str) -> tuple[Param, ...]:
    return _lion(bits, paged_keyword=not cls.startswith("Paged"))


def _ademamix_build(bits: int, cls: str) -> tuple[Param, ...]:
    return _ademamix(bits, paged_keyword=not cls.startswith("Paged"))


def _broken_ademamix32(entries: list[Entry]) -> list[Entry]:
    """Mark AdEMAMix32bit and PagedAdEMAMix32bit limited (their state is one buffer short)."""
    working = {"AdEMAMix32bit": "ademamix", "PagedAdEMAMix32bit": "pagedademamix"}
    return [
        attrs.evolve(
            item,
            limitation=_BROKEN_ADEMAMIX32.format(
                version=LIBRARY_VERSION, cls=item.cls, working=working[item.cls]
            ),
        )
        if item.cls in working
        else item
        for item in entries
    ]


_TORCH_LARS = Entry(
    name="pytorchlars",
    cls="PytorchLARS",
    module="bitsandbytes.optim.lars",
    params=(
        _lr(1e-2),
        Param("momentum", 0, "momentum_required"),
        Param("dampening", 0, "non_negative"),
        Param("weight_decay", 0, "non_negative"),
        Param("nesterov", False, "bool"),
        Param("max_unorm", 0.02, "non_negative"),
    ),
    bits=32,
    paged=False,
    state=_STATE["torch_lars"],
    paper=_PAPERS["lars"],
    description="bitsandbytes' LARS written in plain torch (momentum > 0: without momentum "
    "its step fails), float32 state in torch's momentum_buffer layout.",
)

CATALOG: tuple[Entry, ...] = (
    *_variants("adam", "adam", _adam_build(0), pageable=True),
    *_variants("adamw", "adamw", _adam_build(1e-2), pageable=True),
    *_variants("lion", "lion", _lion_build, pageable=True),
    *_broken_ademamix32(_variants("ademamix", "ademamix", _ademamix_build, pageable=True)),
    *_variants("lamb", "lamb", lambda bits, cls: _lamb(bits), pageable=False),
    *_variants("lars", "lars", lambda bits, cls: _momentum_family(bits, lars=True), pageable=False),
    _TORCH_LARS,
    *_variants("sgd", "sgd", lambda bits, cls: _momentum_family(bits, lars=False), pageable=False),
    *_variants("rmsprop", "rmsprop", lambda bits, cls: _rmsprop(bits), pageable=False),
    *_variants("adagrad", "adagrad", lambda bits, cls: _adagrad(bits), pageable=False),
)
"""Every optimizer class ``bitsandbytes.optim`` exports, by family."""


def entry(name: str) -> Entry:
    """The catalogue entry registered as ``name``.

    Raises:
        KeyError: no such entry.
    """
    for item in CATALOG:
        if item.name == name:
            return item
    raise KeyError(name)
