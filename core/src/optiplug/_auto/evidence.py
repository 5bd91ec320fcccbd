"""The leaderboard's evidence for AutoOptimizer: measurements a selection's candidates cite.

A :class:`Measurement` is one optimizer's row of the leaderboard on one
workload, compared with AdamW's (``optiplug leaderboard`` computes them;
``optiplug_train.board_evidence`` reads them from a results file). The published
board's measurements ship as ``board_evidence.json`` beside this module,
written by ``scripts/leaderboard_page.py`` from the committed results file.
A request maps to the nearest workload kind by :func:`nearest_workload`.

Importing this module does not import torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from .._core.specs import SelectionRequest

__all__ = [
    "MOST_USED",
    "Measurement",
    "cite",
    "compare_most_used",
    "load_evidence",
    "nearest_workload",
]

MOST_USED = (
    "adamw",
    "adam",
    "sgd",
    "torch:rmsprop",
    "torch:adagrad",
    "pytorch_optimizer:adafactor",
    "lion",
    "pytorch_optimizer:lamb",
    "muon",
    "adamw_schedulefree",
)
"""The ten algorithms users reach for most, by board name, cited beside every selection.

torch.optim's five most common (AdamW, Adam, SGD, RMSprop, Adagrad); the
memory-lean and sign-based ones transformers' ``TrainingArguments.optim``
and timm's factory both name (Adafactor, Lion, LAMB); Muon, the speedrun's
optimizer; Schedule-Free AdamW, AlgoPerf's self-tuning winner."""

_FILE = "board_evidence.json"

_LANGUAGE = ("text", "causal-lm", "fill-mask", "translation", "summarization", "question", "token")
_VISION = ("image", "object-detection", "video", "depth", "segmentation")
_MODULES = {
    "Conv": "digits",
    "Embedding": "char-lm",
    "Transformer": "char-lm",
    "Attention": "char-lm",
}


@attrs.frozen
class Measurement:
    """An optimizer on one leaderboard workload, against AdamW there.

    Attributes:
        optimizer: the catalogue name.
        workload: the workload (``char-lm``, ``digits``, ``diabetes``, ``logistic``).
        status: ``reached``, ``not reached``, ``diverged`` or ``failed``.
        seeds: how many seeds the row has.
        steps_ratio: its mean steps to target over AdamW's (None unless both reached).
        p: Welch's two-sided p against AdamW (None with fewer than two seeds).
        p_on: what ``p`` compares, ``"steps"`` (to target) or ``"final"`` (metric).
        final: its mean final validation metric (None when no seed finished).
        adamw_final: AdamW's on the same workload (None when not measured).
    """

    optimizer: str
    workload: str
    status: str
    seeds: int
    steps_ratio: float | None = None
    p: float | None = None
    p_on: str = ""
    final: float | None = None
    adamw_final: float | None = None

    def citation(self) -> str:
        """One line: ``"normuon: 0.83x adamw's steps to target on char-lm, p = 0.003, 5 seeds"``."""
        seeds = f"{self.seeds} seed{'s' if self.seeds != 1 else ''}"
        if self.optimizer == "adamw":
            return f"adamw: the board's baseline on {self.workload}: {self.status}, {seeds}"
        p = "no p-value (one seed)" if self.p is None else f"p = {self.p:.2g} ({self.p_on})"
        if self.steps_ratio is not None:
            what = f"{self.steps_ratio:.2f}x adamw's steps to target on {self.workload}"
        elif self.final is not None and self.adamw_final:
            what = (
                f"{self.status} on {self.workload}, final metric "
                f"{self.final / self.adamw_final:.2f}x adamw's"
            )
        else:
            what = f"{self.status} on {self.workload}"
        return f"{self.optimizer}: {what}, {p}, {seeds}"

    def as_json(self) -> dict[str, Any]:
        """The measurement as a JSON object (what ``board_evidence.json`` holds)."""
        return attrs.asdict(self)


def load_evidence(path: str | os.PathLike[str] | None = None) -> list[Measurement]:
    """The measurements of an evidence file (default: the published board's).

    Args:
        path: a JSON file of a ``measurements`` list, as written by
            ``scripts/leaderboard_page.py``; None reads the packaged one.

    Returns:
        The measurements (none when the packaged file is absent).
    """
    if path is None:
        source = resources.files(__package__).joinpath(_FILE)
        text = source.read_text(encoding="utf-8") if source.is_file() else '{"measurements": []}'
    else:
        text = Path(path).read_text(encoding="utf-8")
    return [Measurement(**entry) for entry in json.loads(text)["measurements"]]


def nearest_workload(request: SelectionRequest) -> str:
    """The leaderboard workload nearest a request: its task, else its model's module types.

    Language tasks (text-*, causal-lm, fill-mask, translation, ...) map to
    ``char-lm``, vision tasks to ``digits``, ``tabular-regression`` and other
    regression tasks to ``diabetes``, ``tabular-classification`` to
    ``logistic``; with no task, a model type naming convolutions maps to
    ``digits`` and anything else (transformers, the default) to ``char-lm``.

    Args:
        request: the selection's request.

    Returns:
        A workload name.
    """
    task = request.task or ""
    if "regression" in task:
        return "diabetes"
    if task == "tabular-classification":
        return "logistic"
    if any(word in task for word in _VISION):
        return "digits"
    if any(word in task for word in _LANGUAGE):
        return "char-lm"
    kind = request.model_type or ""
    return next((w for name, w in _MODULES.items() if name in kind), "char-lm")


def compare_most_used(
    workload: str, evidence: Sequence[Measurement], skip: Iterable[str] = ()
) -> list[str]:
    """The measurement on ``workload`` of each of :data:`MOST_USED`, for comparison.

    Args:
        workload: the workload the request maps to.
        evidence: the measurements to cite from.
        skip: algorithms already cited (a selection's candidates).

    Returns:
        One line per algorithm not in ``skip``, "not measured" when the board lacks it.
    """
    found = {(m.optimizer, m.workload): m for m in evidence}
    left = [name for name in MOST_USED if name not in set(skip)]
    return [
        found[(name, workload)].citation()
        if (name, workload) in found
        else f"{name}: not measured on {workload}"
        for name in left
    ]


def cite(
    candidates: Iterable[tuple[str, str]], workload: str, evidence: Sequence[Measurement]
) -> list[str]:
    """One line per candidate: its measurement on ``workload``, else its rule's own source.

    Args:
        candidates: ``(algorithm, reason)`` pairs, as the selection ranks them.
        workload: the workload the request maps to.
        evidence: the measurements to cite from.

    Returns:
        The lines, a candidate once each.
    """
    found = {(m.optimizer, m.workload): m for m in evidence}
    lines, seen = [], set()
    for algorithm, reason in candidates:
        if algorithm in seen:
            continue
        seen.add(algorithm)
        measured = found.get((algorithm, workload))
        if measured is not None:
            lines.append(measured.citation())
        else:
            lines.append(f"{algorithm}: not measured on {workload}; the rule's source: {reason}")
    return lines
