"""Lion's pretraining rule for ``AutoOptimizer`` (no torch import).

Lion at a third of AdamW's pretraining lr and three times its weight decay
(Chen et al. 2023), betas (0.9, 0.95) up to 1e8 parameters (GPT-NeoX's
small-LM configuration), the paper's language-model (0.95, 0.98) beyond.
AdamW's lr is the core's ``pretraining:adamw`` one
(:meth:`optiplug.AutoOptimizer.pretraining_lr`).
"""

from __future__ import annotations

import optiplug

__all__ = ["LION_FACTOR", "LION_SCORE", "pretraining_rule"]

LION_SCORE = 15.0
"""Below the core's pretraining AdamW rule (20), so Lion decides only where AdamW is
missing; ``AutoOptimizer.tune`` measures it as the third candidate when its budget
allows three (2250 steps and more)."""

LION = "Lion (Chen et al. 2023, 'Symbolic Discovery of Optimization Algorithms')"
NEOX_LION = (
    "GPT-NeoX's Lion test configuration (EleutherAI 2023: a 10-layer, 512-wide LM at "
    "lr 3.3e-4 = AdamW's 1e-3 / 3, betas (0.9, 0.95))"
)

LION_FACTOR = 3
"""Lion's lr is AdamW's / 3 and its weight decay AdamW's * 3 (the paper: 3-10x), lr*wd kept."""

ADAMW_WEIGHT_DECAY = 0.1
"""The weight decay of the core's pretraining AdamW rule (GPT-3's)."""

SMALL_BETAS = (0.9, 0.95)
"""Lion's betas for N <= 1e8 (GPT-NeoX's small-LM configuration): a short momentum memory."""

LM_BETAS = (0.95, 0.98)
"""Lion's betas for larger language models (the paper's language-model runs)."""

SMALL_N = 10**8


def pretraining_rule(request: optiplug.SelectionRequest) -> list[optiplug.Candidate]:
    """Lion for pretraining: AdamW's lr / 3 and weight decay * 3, betas by size.

    Args:
        request: the selection request.

    Returns:
        One candidate (score :data:`LION_SCORE`, rule ``pretraining:lion``) for
        ``stage="pretraining"``: betas (0.9, 0.95) for N <= 1e8 or unknown,
        (0.95, 0.98) beyond; none for another stage.
    """
    if request.stage != "pretraining":
        return []
    n = request.num_parameters
    adamw_lr, source = optiplug.AutoOptimizer.pretraining_lr(n)
    lr = float(f"{adamw_lr / LION_FACTOR:.3g}")
    weight_decay = round(ADAMW_WEIGHT_DECAY * LION_FACTOR, 6)
    small = n is None or n <= SMALL_N
    betas, betas_source = (
        (SMALL_BETAS, f"N <= 1e8: {NEOX_LION}")
        if small
        else (LM_BETAS, f"N > 1e8: {LION}, language-model runs")
    )
    reason = (
        f"pretraining, N={'unknown' if n is None else f'{n:,}'}: Lion at AdamW's lr / "
        f"{LION_FACTOR} ({lr:g}; AdamW's {adamw_lr:g} from {source}) and weight decay x "
        f"{LION_FACTOR} ({weight_decay:g}), from {LION}: lr 3-10x smaller, weight decay 3-10x "
        f"larger than AdamW's; betas {betas} from {betas_source}"
    )
    hparams = {"lr": lr, "betas": betas, "weight_decay": weight_decay}
    return [optiplug.Candidate("lion", hparams, LION_SCORE, reason, rule="pretraining:lion")]
