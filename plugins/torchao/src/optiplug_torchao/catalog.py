"""The optimizers of ``torchao.optim`` as a static table (torch-free, torchao-free).

Written from the installed torchao (class signatures and defaults, the
papers its docstrings cite; eight classes do not call for a generator): the
value ranges (``check``) follow torchao's own argument checks, tightened
where a value the library accepts breaks the step (an ``eps`` of 0 divides
zero by zero where a gradient element is 0). A test
compares this table with the installed classes, so an upgrade that changes
a signature or a default fails loudly.
"""

from __future__ import annotations

from typing import Any

import attrs

from optiplug import StateSlot

__all__ = [
    "CATALOG",
    "LIBRARY",
    "LIBRARY_VERSION",
    "Entry",
    "Param",
    "entry",
]

LIBRARY = "torchao"
LIBRARY_VERSION = "0.18.0"
"""The torchao release this table was generated from and tested against."""


@attrs.frozen
class Param:
    """One constructor keyword of a library class.

    Attributes:
        name: the keyword.
        default: its default in the class signature.
        check: the range, a key of :data:`optiplug_torchao.config.CHECKS`.
    """

    name: str
    default: Any
    check: str


@attrs.frozen
class Entry:
    """One bridged class.

    Attributes:
        name: the registered name: the class name lower-cased
            (``AdamW8bit`` is ``adamw8bit``), as the other bridges name
            theirs; ``_AdamW`` is ``adamw_quantized_training``, what torchao
            made it for (a bridged ``adamw`` would be given the first-party
            adamw's implementation records, which attach by plain name), and
            ``CPUOffloadOptimizer`` is ``cpu_offload``.
        cls: the class name in ``torchao.optim``.
        module: the module defining it.
        params: its constructor keywords, in signature order (``params`` excluded).
        state: the per-parameter state it keeps.
        paper: the paper its docstrings cite ("" if none).
        limitation: why it cannot pass optiplug's checks on a CPU ("" if it can).
        description: one paragraph for ``optiplug show``.
        example_shape: the parameter shape the conformance checks use.
        example_dtype: the parameter dtype the conformance checks use.
    """

    name: str
    cls: str
    module: str
    params: tuple[Param, ...]
    state: tuple[StateSlot, ...]
    paper: str
    description: str
    limitation: str = ""
    example_shape: tuple[int, ...] | None = (64, 64)
    example_dtype: str | None = "float32"

    @property
    def target(self) -> str:
        """``"module:Class"`` of the library class."""
        return f"{self.module}:{self.cls}"


def _adam_params(weight_decay: float | int, block_size: int | None) -> tuple[Param, ...]:
    own = (
        Param("lr", 1e-3, "lr"),
        Param("betas", (0.9, 0.999), "betas"),
        Param("eps", 1e-8, "eps"),
        Param("weight_decay", weight_decay, "non_negative"),
        Param("amsgrad", False, "bool"),
    )
    sized = () if block_size is None else (Param("block_size", block_size, "positive_int"),)
    return (*own, *sized, Param("bf16_stochastic_round", False, "bool"))


def _state(kind: str) -> tuple[StateSlot, ...]:
    stored = (
        f"{kind}-quantized when the parameter has >= 4096 elements divisible by block_size"
        if kind
        else "a plain tensor"
    )
    return (
        StateSlot(
            "step",
            shape="scalar",
            dtype="float32",
            constraints=("finite", "non_negative", "integral"),
            description="steps taken (a float32 0-d tensor)",
        ),
        StateSlot("exp_avg", description=f"first moment; {stored}"),
        StateSlot(
            "exp_avg_sq",
            constraints=("finite", "non_negative"),
            description=f"second moment; {stored}",
        ),
        StateSlot(
            "max_exp_avg_sq",
            when="amsgrad",
            constraints=("finite", "non_negative"),
            description=f"running maximum of the second moment; {stored}",
        ),
    )


_ADAM = "torchao.optim.adam"
_PAPER_8BIT = "https://arxiv.org/abs/2110.02861"
_PAPER_4BIT = "https://arxiv.org/abs/2309.01507"
_PAPER_FP8 = "https://arxiv.org/abs/2409.12517"
_STEP = "One torch.compile'd kernel per parameter (fp32 math)"


def _entry(
    name: str, cls: str, decay: float | int, block: int | None, paper: str, text: str
) -> Entry:
    kind = {"8bit": "8-bit", "4bit": "4-bit", "Fp8": "FP8 (E4M3)"}
    quantized = next((v for k, v in kind.items() if cls.endswith(k)), "")
    return Entry(
        name=name,
        cls=cls,
        module=_ADAM,
        params=_adam_params(decay, block),
        state=_state(quantized),
        paper=paper,
        description=text + f" {_STEP}.",
    )


CATALOG: tuple[Entry, ...] = (
    _entry(
        "adamw8bit",
        "AdamW8bit",
        1e-2,
        256,
        _PAPER_8BIT,
        "AdamW with 8-bit blockwise-quantized moments (dynamic-tree quantization map).",
    ),
    _entry(
        "adamw4bit",
        "AdamW4bit",
        1e-2,
        128,
        _PAPER_4BIT,
        "AdamW with 4-bit blockwise-quantized moments (linear map for the second moment).",
    ),
    _entry(
        "adamwfp8",
        "AdamWFp8",
        1e-2,
        256,
        _PAPER_FP8,
        "AdamW with FP8 (E4M3) blockwise-scaled moments.",
    ),
    _entry(
        "adam8bit",
        "Adam8bit",
        0,
        256,
        _PAPER_8BIT,
        "Adam (L2 weight decay) with 8-bit blockwise-quantized moments.",
    ),
    _entry(
        "adam4bit",
        "Adam4bit",
        0,
        128,
        _PAPER_4BIT,
        "Adam (L2 weight decay) with 4-bit blockwise-quantized moments.",
    ),
    _entry(
        "adamfp8",
        "AdamFp8",
        0,
        256,
        _PAPER_FP8,
        "Adam (L2 weight decay) with FP8 (E4M3) blockwise-scaled moments.",
    ),
    _entry(
        "adamw_quantized_training",
        "_AdamW",
        1e-2,
        None,
        "",
        "torchao's full-precision AdamW, meant for its quantized-training parameters "
        "(bf16 stochastic rounding).",
    ),
    Entry(
        name="cpu_offload",
        cls="CPUOffloadOptimizer",
        module="torchao.optim.cpu_offload",
        params=(
            Param("optimizer_class", "torch.optim.AdamW", "optimizer_class"),
            Param("offload_gradients", False, "bool"),
            Param("minimal_size", 4096, "positive_int"),
        ),
        state=(),
        paper="",
        description=(
            "Runs another optimizer (optimizer_class, default torch.optim.AdamW) on CPU "
            "copies of device parameters, keeping its state off the accelerator; its other "
            "keywords go to that optimizer."
        ),
        limitation=(
            "needs a CUDA or XPU device (it offloads device parameters to the CPU); "
            "wraps another optimizer class, whose keywords it passes through unchecked"
        ),
        example_shape=None,
        example_dtype=None,
    ),
)
"""Every optimizer class ``torchao.optim`` exports, in its ``__all__`` order by family."""


def entry(name: str) -> Entry:
    """The catalogue entry registered as ``name``.

    Raises:
        KeyError: no such entry.
    """
    for item in CATALOG:
        if item.name == name:
            return item
    raise KeyError(name)
