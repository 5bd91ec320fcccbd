"""Entry-point module of optiplug-muon: hookimpls only, no torch import."""

from __future__ import annotations

import optiplug

from .config import MUON_STATE, NORMUON_STATE, MuonConfig, NorMuonConfig

OPTIPLUG_API = 1

PRETRAINING_SCORE = 30.0
"""Outranks the core's pretraining AdamW rule (20) and the lion plugin's (15)."""

PRETRAINING_TASKS = frozenset({None, "text-generation"})
"""The tasks the pretraining rule answers: causal LMs, and a request that names none."""


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide ``muon`` and ``normuon``."""
    return [
        optiplug.OptimizerSpec(
            name="muon",
            factory=optiplug.lazy("optiplug_muon.optimizer:Muon"),
            config=MuonConfig,
            description=(
                "Muon: Newton-Schulz-orthogonalised Nesterov momentum for hidden matrices; "
                "embeddings, output heads and non-matrix parameters go to an auxiliary AdamW "
                "in the same optimizer (see optimizer.routing())."
            ),
            state_slots=MUON_STATE,
            capabilities=frozenset({"matrices", "routing"}),
        ),
        optiplug.OptimizerSpec(
            name="normuon",
            factory=optiplug.lazy("optiplug_muon.normuon:NorMuon"),
            config=NorMuonConfig,
            description=(
                "NorMuon (arXiv 2510.05491): Muon with each row (output neuron) of the "
                "orthogonalised update normalised by an EMA of its mean square; embeddings, "
                "output heads and non-matrix parameters go to an auxiliary AdamW."
            ),
            state_slots=NORMUON_STATE,
            capabilities=frozenset({"matrices", "routing"}),
        ),
    ]


@optiplug.hookimpl
def optiplug_select_optimizer(
    request: optiplug.SelectionRequest,
) -> list[optiplug.Candidate]:
    """Propose muon at its defaults for pretraining (causal LMs, or no task named).

    Never for fine-tuning or an unknown stage: Moonlight (Liu et al. 2025)
    reports Muon fine-tuning of AdamW-pretrained models as mixed.
    """
    if request.stage != "pretraining" or request.task not in PRETRAINING_TASKS:
        return []
    reason = (
        ("causal-LM " if request.task else "")
        + "pretraining: Muon trains the hidden matrices in fewer steps than AdamW "
        "(embeddings, head and norms go to its auxiliary AdamW); lr 0.02, momentum 0.95, "
        "Nesterov, 5 Newton-Schulz steps as in Jordan et al. 2024, 'Muon: An optimizer for "
        "hidden layers in neural networks'; pass named_parameters()"
    )
    return [optiplug.Candidate("muon", {}, PRETRAINING_SCORE, reason, rule="muon:pretraining")]
