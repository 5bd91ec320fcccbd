"""The core's built-in selection rules, registered through ``optiplug_select_optimizer``.

The rules split by training stage (``SelectionRequest.stage``):

* **pretraining** (from scratch): AdamW with betas (0.9, 0.95) and weight
  decay 0.1 at the learning rate GPT-3 (Brown et al. 2020, Table 2.1) lists
  for the model size, 1e-3 below 100M parameters (nanoGPT's small models).
  Plugins propose their own algorithms beside it (their rules may scale
  their lr from :func:`pretraining_lr`, public as
  :meth:`optiplug.AutoOptimizer.pretraining_lr`).
* **fine-tuning**: size rules (score 10) and task rules (score 20) at
  1e-5 to 5e-5, from BERT (Devlin et al. 2019, Appendix A.3) and Llama 2
  (Touvron et al. 2023, Section 3.1).
* **unknown stage**: the fine-tuning rules (a low lr only slows a run from
  scratch; a pretraining lr can wreck pretrained weights), and every built-in
  reason says "stage unknown" so ``explain()`` shows the assumption.

Every candidate's ``reason`` names its source (paper and table or section).
Plugins add their own rules the same way.
"""

from __future__ import annotations

from .._core.hooks import hookimpl
from .._core.specs import Candidate, SelectionRequest

__all__ = [
    "FINETUNING_SIZE_RULES",
    "GPT3_LEARNING_RATES",
    "KNOWN_TASKS",
    "PRETRAINING_SCORE",
    "SIZE_SCORE",
    "SMALL_PRETRAINING_LR",
    "TASK_RULES",
    "TASK_SCORE",
    "finetuning_size_rule",
    "optiplug_select_optimizer",
    "pretraining_lr",
    "pretraining_rules",
    "size_rule",
]

SIZE_SCORE = 10.0
"""Fine-tuning size rules: always answer, lowest rank."""
TASK_SCORE = 20.0
"""Fine-tuning task rules: outrank the size rules for the tasks they know."""
PRETRAINING_SCORE = 20.0
"""The pretraining AdamW rule."""
GPT3 = "GPT-3 (Brown et al. 2020, Table 2.1)"
NANOGPT = "nanoGPT (Karpathy, config/train_shakespeare_char.py: lr 1e-3)"
BERT = "BERT (Devlin et al. 2019, Appendix A.3: lr in {5e-5, 3e-5, 2e-5})"
BERT_ADAM = "BERT (Devlin et al. 2019, Appendix A.2: betas (0.9, 0.999), weight decay 0.01)"
LLAMA2 = "Llama 2 (Touvron et al. 2023, Section 3.1: SFT lr 2e-5, weight decay 0.1)"

SMALL_PRETRAINING_LR = 1e-3
"""Pretraining lr for N <= 1e8 (below GPT-3's smallest model)."""
SMALL_PRETRAINING_N = 10**8

GPT3_LEARNING_RATES: tuple[tuple[int, float, str], ...] = (
    (125 * 10**6, 6.0e-4, "125M"),
    (350 * 10**6, 3.0e-4, "350M"),
    (760 * 10**6, 2.5e-4, "760M"),
    (1_300 * 10**6, 2.0e-4, "1.3B"),
    (2_700 * 10**6, 1.6e-4, "2.7B"),
    (6_700 * 10**6, 1.2e-4, "6.7B"),
    (13_000 * 10**6, 1.0e-4, "13B"),
    (175_000 * 10**6, 0.6e-4, "175B"),
)
"""GPT-3 Table 2.1: (parameters, learning rate, model name); betas (0.9, 0.95), wd 0.1."""

PRETRAINING_BETAS = (0.9, 0.95)
PRETRAINING_WEIGHT_DECAY = 0.1

FINETUNING_SIZE_RULES: tuple[tuple[float, str, dict[str, object], str, str], ...] = (
    (1e9, "adamw", {"lr": 2e-5, "betas": (0.9, 0.95), "weight_decay": 0.1}, "N > 1e9", LLAMA2),
    (
        1e8,
        "adamw",
        {"lr": 2e-5, "betas": (0.9, 0.999), "weight_decay": 0.01},
        "1e8 < N <= 1e9",
        f"{BERT}; {BERT_ADAM}",
    ),
)
"""Fine-tuning by size: (exclusive lower bound on N, algorithm, hparams, condition, source).
Smaller or unknown N: adam lr 5e-5, BERT's largest grid value."""

TASK_RULES: dict[str, tuple[str, dict[str, object], str]] = {
    "text-generation": (
        "adamw",
        {"lr": 2e-5, "betas": (0.9, 0.95), "weight_decay": 0.1},
        LLAMA2,
    ),
    "text-classification": ("adam", {"lr": 2e-5}, f"{BERT}, GLUE"),
    "question-answering": ("adamw", {"lr": 3e-5, "weight_decay": 0.01}, f"{BERT}; {BERT_ADAM}"),
}
"""Fine-tuning task rules: task -> (algorithm, hyperparameters, source), normalised names."""

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

STAGE_UNKNOWN = (
    "stage unknown, assumed fine-tuning (pass stage='pretraining' to train from scratch)"
)


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


def pretraining_lr(n: int | None) -> tuple[float, str]:
    """AdamW's pretraining learning rate for ``n`` parameters, and where it comes from.

    Args:
        n: the parameter count, or None (treated as small).

    Returns:
        ``(lr, source)``: 1e-3 for N <= 1e8 or unknown (nanoGPT); otherwise the
        lr of the smallest GPT-3 model at least as large as N (the more
        conservative neighbour), 6e-5 beyond 175B.
    """
    if n is None or n <= SMALL_PRETRAINING_N:
        return SMALL_PRETRAINING_LR, f"N <= 1e8, below GPT-3's smallest model: {NANOGPT}"
    for size, lr, name in GPT3_LEARNING_RATES:
        if n <= size:
            return lr, f"{GPT3}, {name} row (smallest model >= N)"
    size, lr, name = GPT3_LEARNING_RATES[-1]
    return lr, f"{GPT3}, {name} row (largest listed)"


def pretraining_rules(request: SelectionRequest) -> list[Candidate]:
    """The pretraining candidate: AdamW by size.

    Args:
        request: a request with ``stage == "pretraining"``.

    Returns:
        The AdamW candidate.
    """
    n = request.num_parameters
    lr, source = pretraining_lr(n)
    adamw = {"lr": lr, "betas": PRETRAINING_BETAS, "weight_decay": PRETRAINING_WEIGHT_DECAY}
    return [
        Candidate(
            "adamw",
            adamw,
            PRETRAINING_SCORE,
            f"pretraining, N={_count(n)}: lr {lr:g} from {source}; "
            f"betas (0.9, 0.95), weight decay 0.1 from {GPT3}",
            rule="pretraining:adamw",
        )
    ]


def finetuning_size_rule(request: SelectionRequest) -> Candidate:
    """The fine-tuning size rule's candidate (N unknown counts as small).

    Args:
        request: the selection request (stage "finetuning" or None).

    Returns:
        adamw for N > 1e9 or N > 1e8 (different settings), else adam lr=5e-5.
    """
    n = request.num_parameters
    matching = [rule for rule in FINETUNING_SIZE_RULES if n is not None and n > rule[0]]
    if matching:
        _, algorithm, hparams, why, source = matching[0]
    else:
        algorithm, hparams, source = "adam", {"lr": 5e-5}, BERT
        why = "N <= 1e8" if n is not None else "N unknown"
    prefix = ""
    if request.task is not None and request.task not in TASK_RULES:
        prefix = f"no rule for task {request.task!r}, so by size: "
    stage = "fine-tuning" if request.stage == "finetuning" else STAGE_UNKNOWN
    return Candidate(
        algorithm,
        dict(hparams),
        SIZE_SCORE,
        f"{prefix}{stage}; N={_count(n)}: {why}; from {source}",
        rule="size",
    )


size_rule = finetuning_size_rule
"""The 0.1 name of :func:`finetuning_size_rule`."""


@hookimpl
def optiplug_select_optimizer(request: SelectionRequest) -> list[Candidate]:
    """Propose the built-in candidates for ``request``'s stage, size and task."""
    if request.stage == "pretraining":
        return pretraining_rules(request)
    found = [finetuning_size_rule(request)]
    if request.task in TASK_RULES:
        algorithm, hparams, source = TASK_RULES[request.task]
        stage = "fine-tuning" if request.stage == "finetuning" else STAGE_UNKNOWN
        reason = f"{stage}; task {request.task!r} rule (outranks the size rule), from {source}"
        found.append(
            Candidate(algorithm, dict(hparams), TASK_SCORE, reason, rule=f"task:{request.task}")
        )
    return found
