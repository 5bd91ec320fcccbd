"""The optimizers of ``galore-torch`` as a static table (torch-free, galore-free).

Written from the installed galore-torch 1.0 (class signatures and defaults,
the paper its README cites). A test compares this table with the installed
classes, so an upgrade that changes a signature or a default fails loudly.

GaLore projects a matrix's gradient onto a low-rank subspace (the top
singular vectors of the gradient, refreshed every ``update_proj_gap``
steps), keeps the optimizer's moments there, and projects the update back,
scaled by ``scale``. Which parameters are projected is a param-group
matter: a group carrying ``rank`` (with ``update_proj_gap``, ``scale`` and
``proj_type``) is projected, any other group steps as the plain method.
"""

from __future__ import annotations

from typing import Any

import attrs

from optiplug import StateSlot

__all__ = [
    "CATALOG",
    "LIBRARY",
    "LIBRARY_VERSION",
    "PAPER",
    "PROJECTION_KEYS",
    "PROJECTOR_FIELDS",
    "PROJ_TYPES",
    "Entry",
    "Param",
    "entry",
]

LIBRARY = "galore-torch"
LIBRARY_VERSION = "1.0"
"""The galore-torch release this table was written from and tested against."""

PAPER = "https://arxiv.org/abs/2403.03507"
"""Zhao et al., 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank Projection"."""

PROJECTION_KEYS = ("rank", "update_proj_gap", "scale", "proj_type")
"""The param-group keys the classes read to project a group (all four, when ``rank`` is there)."""

PROJ_TYPES = ("std", "reverse_std", "right", "left", "full")
"""The ``proj_type`` values ``GaLoreProjector`` implements."""

PROJECTOR_FIELDS = ("rank", "verbose", "update_proj_gap", "scale", "proj_type", "ortho_matrix")
"""The attributes of a ``GaLoreProjector``: what a checkpoint keeps of one."""


@attrs.frozen
class Param:
    """One constructor keyword of a library class.

    Attributes:
        name: the keyword.
        default: its default in the class signature.
        check: the range, a key of :data:`optiplug_galore.config.CHECKS`.
    """

    name: str
    default: Any
    check: str


@attrs.frozen
class Entry:
    """One bridged class.

    Attributes:
        name: the registered name (transformers' ``optim=`` name for it).
        cls: the class name in ``galore_torch``.
        params: the constructor keywords bridged, in signature order.
        state: the per-parameter state it keeps (the projector's as saved).
        description: one paragraph for ``optiplug show``.
        limitation: why it cannot pass optiplug's checks here ("" if it can).
        example_hparams: keywords the conformance checks add.
        example_shape: the parameter shape the conformance checks use (None: theirs).
    """

    name: str
    cls: str
    params: tuple[Param, ...]
    state: tuple[StateSlot, ...]
    description: str
    limitation: str = ""
    example_hparams: dict[str, Any] = attrs.field(factory=dict)
    example_shape: tuple[int, ...] | None = None

    @property
    def target(self) -> str:
        """``"module:Class"`` of the library class."""
        return f"galore_torch:{self.cls}"


def projector_slots() -> tuple[StateSlot, ...]:
    """The saved form of a ``GaLoreProjector`` (present in a group with a ``rank``)."""
    number = ("finite",)
    return (
        StateSlot("projector_rank", kind="number", when="rank", constraints=(*number, "integral")),
        StateSlot("projector_verbose", kind="any", when="rank", description="its verbose flag"),
        StateSlot(
            "projector_update_proj_gap",
            kind="number",
            when="rank",
            constraints=(*number, "integral"),
        ),
        StateSlot("projector_scale", kind="number", when="rank", constraints=number),
        StateSlot("projector_proj_type", kind="any", when="rank", description="its proj_type"),
        StateSlot(
            "projector_ortho_matrix",
            kind="tensors",
            shape="any",
            when="rank",
            description="the projection matrix ([P], or [P, Q] for proj_type 'full')",
        ),
    )


_STEP = StateSlot(
    "step", kind="number", constraints=("finite", "non_negative", "integral"), description="steps"
)
_MOMENTS = (
    StateSlot("exp_avg", shape="any", description="first moment (low-rank where projected)"),
    StateSlot(
        "exp_avg_sq",
        shape="any",
        constraints=("finite", "non_negative"),
        description="second moment (low-rank where projected)",
    ),
)
_ADAFACTOR_STATE = (
    StateSlot("exp_avg", shape="any", when="beta1", description="first moment (beta1 set)"),
    StateSlot(
        "exp_avg_sq_row",
        shape="any",
        optional=True,
        constraints=("finite", "non_negative"),
        description="factored second moment, rows (matrices)",
    ),
    StateSlot(
        "exp_avg_sq_col",
        shape="any",
        optional=True,
        constraints=("finite", "non_negative"),
        description="factored second moment, columns (matrices)",
    ),
    StateSlot(
        "exp_avg_sq",
        shape="any",
        optional=True,
        constraints=("finite", "non_negative"),
        description="second moment (vectors)",
    ),
    StateSlot("RMS", kind="any", description="root mean square of the parameter"),
)
_EIGHT_BIT = (
    *(
        StateSlot(
            f"state{index}",
            shape="any",
            dtype="any",
            description=f"{text}: uint8 codes (8-bit) or float32 (below min_8bit_size elements)",
        )
        for index, text in ((1, "first moment"), (2, "second moment"))
    ),
    *(
        StateSlot(
            f"{kind}{index}",
            shape="any",
            dtype="float32",
            optional=True,
            constraints=("finite", "non_negative") if kind == "absmax" else ("finite",),
            description=f"{kind} of state{index} (8-bit state only)",
        )
        for kind in ("qmap", "absmax")
        for index in (1, 2)
    ),
    StateSlot(
        "unorm_vec",
        shape="any",
        dtype="float32",
        optional=True,
        constraints=("finite", "non_negative"),
        description="the update norm (bitsandbytes keeps it for every parameter)",
    ),
)
_ADAM = (
    Param("lr", 1e-3, "lr"),
    Param("betas", (0.9, 0.999), "betas"),
)
_PROJECTED = (
    "Projected where a param group carries rank, update_proj_gap, scale and proj_type "
    "(matrices only); other groups step as the plain method."
)

CATALOG: tuple[Entry, ...] = (
    Entry(
        name="galore_adamw",
        cls="GaLoreAdamW",
        params=(
            *_ADAM,
            Param("eps", 1e-6, "eps"),
            Param("weight_decay", 0.0, "non_negative"),
            Param("correct_bias", True, "bool"),
            Param("no_deprecation_warning", False, "bool"),
        ),
        state=(_STEP, *_MOMENTS, *projector_slots()),
        description=f"GaLore AdamW: AdamW on the low-rank projected gradient. {_PROJECTED}",
    ),
    Entry(
        name="galore_adamw_8bit",
        cls="GaLoreAdamW8bit",
        params=(
            *_ADAM,
            Param("eps", 1e-8, "eps"),
            Param("weight_decay", 1e-2, "non_negative"),
            Param("min_8bit_size", 4096, "non_negative_int"),
            Param("percentile_clipping", 100, "percentile"),
            Param("block_wise", True, "bool"),
            Param("is_paged", False, "bool"),
        ),
        state=(_STEP, *_EIGHT_BIT, *projector_slots()),
        description="GaLore AdamW with bitsandbytes' 8-bit blockwise state (the class always "
        "keeps 8-bit state for parameters of min_8bit_size elements or more: its amsgrad and "
        f"optim_bits keywords are ignored). {_PROJECTED}",
        example_shape=(64, 64),
    ),
    Entry(
        name="galore_adafactor",
        cls="GaLoreAdafactor",
        params=(
            Param("lr", None, "optional_lr"),
            Param("eps", (1e-30, 1e-3), "eps_pair"),
            Param("clip_threshold", 1.0, "positive"),
            Param("decay_rate", -0.8, "finite"),
            Param("beta1", None, "optional_unit"),
            Param("weight_decay", 0.0, "non_negative"),
            Param("scale_parameter", True, "bool"),
            Param("relative_step", True, "bool"),
            Param("warmup_init", False, "bool"),
        ),
        state=(_STEP, *_ADAFACTOR_STATE, *projector_slots()),
        description="GaLore Adafactor: Adafactor (factored second moment) on the low-rank "
        f"projected gradient. A manual lr needs relative_step=False. {_PROJECTED}",
        example_hparams={"relative_step": False, "scale_parameter": False},
    ),
)
"""Every optimizer class ``galore_torch`` exports."""


def entry(name: str) -> Entry:
    """The catalogue entry registered as ``name``.

    Raises:
        KeyError: no such entry.
    """
    for item in CATALOG:
        if item.name == name:
            return item
    raise KeyError(name)
