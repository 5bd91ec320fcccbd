"""APOLLO's optimizer as a static table (torch-free, apollo_torch-free).

Written from the installed apollo-torch 1.0.3 (``APOLLOAdamW``'s signature
and defaults, the paper its README cites). A test compares this table with
the installed class, so an upgrade that changes a signature or a default
fails loudly.

APOLLO keeps AdamW's moments of a low-rank projection of a matrix's
gradient (a random projection by default, or the gradient's top singular
vectors), turns their update into a per-channel (or per-tensor) scaling
factor, and steps with the full-rank gradient scaled by it, behind Fira's
norm-growth limiter. Which parameters are projected is a param-group
matter: a group carrying ``rank`` (with ``proj``, ``scale_type``,
``update_proj_gap``, ``scale`` and ``proj_type``) is, any other group steps
as AdamW.
"""

from __future__ import annotations

from typing import Any

import attrs

from optiplug import StateSlot

__all__ = [
    "CLASS",
    "LIBRARY",
    "LIBRARY_VERSION",
    "NAME",
    "PAPER",
    "PARAMS",
    "PROJECTION_KEYS",
    "PROJECTORS",
    "PROJ_TYPES",
    "SCALE_TYPES",
    "STATE",
    "Param",
]

LIBRARY = "apollo-torch"
LIBRARY_VERSION = "1.0.3"
"""The apollo-torch release this table was written from and tested against."""

PAPER = "https://arxiv.org/abs/2412.05270"
"""Zhu et al., 2024, "APOLLO: SGD-like Memory, AdamW-level Performance"."""

NAME = "apollo_adamw"
"""The registered name (transformers' ``optim=`` name for it)."""

CLASS = "APOLLOAdamW"
"""The class name in ``apollo_torch``."""

PROJECTION_KEYS = ("rank", "proj", "scale_type", "update_proj_gap", "scale", "proj_type")
"""The param-group keys the class reads to project a group (all six, when ``rank`` is there)."""

PROJ_TYPES = ("std", "reverse_std", "right", "left")
"""The ``proj_type`` values both projectors step with (``"full"``: the random projector
raises NotImplementedError, the SVD one fails on its second step)."""

SCALE_TYPES = ("channel", "tensor")
"""How the scaling factor is computed: per channel or for the whole tensor."""

PROJECTORS: dict[str, tuple[str, tuple[str, ...]]] = {
    "random": (
        "GradientProjector",
        ("rank", "verbose", "update_proj_gap", "scale", "proj_type", "ortho_matrix", "seed",
         "svd_count"),
    ),
    "svd": (
        "GaLoreProjector",
        ("rank", "verbose", "update_proj_gap", "scale", "ortho_matrix", "proj_type", "svd_count"),
    ),
}  # fmt: skip
"""``proj`` -> (the projector class apollo_torch builds, its attributes: what a checkpoint keeps)."""


@attrs.frozen
class Param:
    """One constructor keyword of the library class.

    Attributes:
        name: the keyword.
        default: its default in the class signature.
        check: the range, a key of :data:`optiplug_apollo.config.CHECKS`.
    """

    name: str
    default: Any
    check: str


PARAMS: tuple[Param, ...] = (
    Param("lr", 1e-3, "lr"),
    Param("betas", (0.9, 0.999), "betas"),
    Param("eps", 1e-6, "eps"),
    Param("weight_decay", 0.0, "non_negative"),
    Param("correct_bias", True, "bool"),
    Param("scale_front", False, "bool"),
    Param("disable_nl", False, "bool"),
    Param("no_deprecation_warning", True, "bool"),
)
"""``APOLLOAdamW``'s keywords in signature order."""


def _projector_slots() -> tuple[StateSlot, ...]:
    """The saved form of a projector: present once a projected parameter has stepped."""
    whole = ("finite", "integral")
    return (
        StateSlot("projector_kind", kind="any", when="rank", optional=True,
                  description="GradientProjector (proj='random') or GaLoreProjector (proj='svd')"),
        StateSlot("projector_rank", kind="number", when="rank", optional=True, constraints=whole),
        StateSlot("projector_verbose", kind="any", when="rank", optional=True),
        StateSlot("projector_update_proj_gap", kind="number", when="rank", optional=True,
                  constraints=whole),
        StateSlot("projector_scale", kind="number", when="rank", optional=True),
        StateSlot("projector_proj_type", kind="any", when="rank", optional=True),
        StateSlot("projector_ortho_matrix", kind="tensors", shape="any", when="rank",
                  optional=True, description="the projection matrix, as [P]"),
        StateSlot("projector_seed", kind="number", when="rank", optional=True, constraints=whole,
                  description="the random projector's next seed (proj='random')"),
        StateSlot("projector_svd_count", kind="number", when="rank", optional=True,
                  constraints=whole),
    )  # fmt: skip


STATE: tuple[StateSlot, ...] = (
    StateSlot(
        "seed",
        kind="number",
        constraints=("finite", "integral"),
        description="the parameter's position, the random projector's first seed (set when built)",
    ),
    StateSlot("step", kind="number", optional=True, constraints=("finite", "integral")),
    StateSlot("exp_avg", shape="any", optional=True, description="first moment (low-rank)"),
    StateSlot(
        "exp_avg_sq",
        shape="any",
        optional=True,
        constraints=("finite", "non_negative"),
        description="second moment (low-rank where projected)",
    ),
    StateSlot(
        "scaled_grad",
        shape="scalar",
        dtype="any",
        optional=True,
        constraints=("finite", "non_negative"),
        description="the norm-growth limiter's last scaled-gradient norm (projected groups)",
    ),
    *_projector_slots(),
)
"""The per-parameter state ``APOLLOAdamW`` keeps (the projector as saved)."""
