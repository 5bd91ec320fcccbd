"""GrokAdamW as a static table (torch-free, grokadamw-free).

Written from the installed grokadamw 0.1.2 (``GrokAdamW``'s signature and
defaults). A test compares this table with the installed class, so an
upgrade that changes a signature or a default fails loudly.

GrokAdamW adds to each gradient ``lamb`` times an EMA of the gradients
(decay ``alpha_init``, lowered by a grokking signal: the gap between the
group's ``eval_loss`` and ``train_loss``, or the mean of
``grokking_signal_fns``), then steps AdamW with a per-layer first-moment
decay ``beta1 * (1 - gamma) ** i`` (``i``: the parameter's index among its
group's parameters with a gradient) after clipping each parameter's gradient
norm to ``gradient_clipping``.
"""

from __future__ import annotations

from typing import Any

import attrs

from optiplug import StateSlot

__all__ = ["CLASS", "LIBRARY", "LIBRARY_VERSION", "NAME", "PARAMS", "STATE", "Param"]

LIBRARY = "grokadamw"
LIBRARY_VERSION = "0.1.2"
"""The grokadamw release this table was written from and tested against."""

NAME = "grokadamw"
"""The registered name (transformers' ``optim=`` name for it)."""

CLASS = "GrokAdamW"
"""The class name in ``grokadamw``."""


@attrs.frozen
class Param:
    """One constructor keyword of the library class.

    Attributes:
        name: the keyword.
        default: its default in the class signature.
        check: the range, a key of :data:`optiplug_grokadamw.config.CHECKS`.
    """

    name: str
    default: Any
    check: str


PARAMS: tuple[Param, ...] = (
    Param("lr", 1e-3, "lr"),
    Param("betas", (0.9, 0.999), "betas"),
    Param("eps", 1e-8, "eps"),
    Param("weight_decay", 1e-2, "non_negative"),
    Param("alpha_init", 0.98, "closed_unit"),
    Param("lamb", 2.0, "finite"),
    Param("gamma", 0.1, "closed_unit"),
    Param("grokking_signal_fns", None, "signal_fns"),
    Param("grokking_signal_decay_rate", 0.1, "finite"),
    Param("gradient_clipping", 1.0, "non_negative"),
)
"""``GrokAdamW``'s keywords in signature order."""

STATE: tuple[StateSlot, ...] = (
    StateSlot(
        "step",
        kind="number",
        constraints=("finite", "non_negative", "integral"),
        description="steps taken (a Python int)",
    ),
    StateSlot("exp_avg", description="first moment (EMA of the amplified gradient)"),
    StateSlot(
        "exp_avg_sq",
        constraints=("finite", "non_negative"),
        description="second moment (EMA of the squared amplified gradient)",
    ),
    StateSlot("grok_ema", description="EMA of the gradients (decay alpha), amplified by lamb"),
)
"""The per-parameter state ``GrokAdamW`` keeps (kept on the CPU by the library)."""
