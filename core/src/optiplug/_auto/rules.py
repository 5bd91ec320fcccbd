"""The core's built-in selection rules, registered through ``optiplug_select_optimizer``.

Size rules (score 10) always answer, by parameter count N; task rules
(score 20) outrank them for the tasks they know. Plugins add their own rules
the same way (the muon plugin proposes muon for causal-LM pretraining).
"""

from __future__ import annotations

from .._core.hooks import hookimpl
from .._core.specs import Candidate, SelectionRequest

__all__ = [
    "KNOWN_TASKS",
    "SIZE_SCORE",
    "TASK_RULES",
    "TASK_SCORE",
    "optiplug_select_optimizer",
    "size_rule",
]

SIZE_SCORE = 10.0
TASK_SCORE = 20.0

TASK_RULES: dict[str, tuple[str, dict[str, object]]] = {
    "text-generation": ("adamw", {"lr": 2e-5, "betas": (0.9, 0.95), "weight_decay": 0.1}),
    "text-classification": ("adam", {"lr": 2e-5}),
    "question-answering": ("adamw", {"lr": 3e-5, "weight_decay": 0.01}),
}
"""Task -> (algorithm, hyperparameters), for normalised task names."""

KNOWN_TASKS: frozenset[str] = frozenset(TASK_RULES) | {
    "audio-classification",
    "automatic-speech-recognition",
    "feature-extraction",
    "fill-mask",
    "image-classification",
    "image-segmentation",
    "multiple-choice",
    "object-detection",
    "summarization",
    "table-question-answering",
    "text2text-generation",
    "token-classification",
    "translation",
    "zero-shot-classification",
}
"""Every task name ``optiplug auto --task`` accepts (normalised; aliases fold into these).

A known task without a rule here falls back to the size rules (plugins may
have rules for it); a name outside this list is a typo, refused with a
did-you-mean."""


def size_rule(request: SelectionRequest) -> Candidate:
    """The size rule's candidate for ``request`` (N unknown counts as small).

    Args:
        request: the selection request.

    Returns:
        adamw for N > 1e9 or N > 1e8 (different settings), else adam lr=5e-5.
    """
    n = request.num_parameters
    if n is not None and n > 1e9:
        algorithm, hparams, why = (
            "adamw",
            {"lr": 1e-5, "betas": (0.9, 0.95), "weight_decay": 0.1},
            "N > 1e9",
        )
    elif n is not None and n > 1e8:
        algorithm, hparams, why = (
            "adamw",
            {"lr": 2e-5, "betas": (0.9, 0.999), "weight_decay": 0.01},
            "1e8 < N <= 1e9",
        )
    else:
        algorithm, hparams, why = "adam", {"lr": 5e-5}, "N <= 1e8" if n is not None else "N unknown"
    prefix = ""
    if request.task is not None and request.task not in TASK_RULES:
        prefix = f"no rule for task {request.task!r}, so by size: "
    count = "unknown" if n is None else f"{n:,}"
    return Candidate(algorithm, hparams, SIZE_SCORE, f"{prefix}N={count}: {why}", rule="size")


@hookimpl
def optiplug_select_optimizer(request: SelectionRequest) -> list[Candidate]:
    """Propose the size rule's choice, and the task rule's when the task has one."""
    found = [size_rule(request)]
    if request.task in TASK_RULES:
        algorithm, hparams = TASK_RULES[request.task]
        reason = f"task {request.task!r} rule (outranks the size rule)"
        found.append(
            Candidate(algorithm, dict(hparams), TASK_SCORE, reason, rule=f"task:{request.task}")
        )
    return found
