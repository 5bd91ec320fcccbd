"""Reading model configs (HF-style ``config.json``) and estimating parameter counts."""

from __future__ import annotations

import decimal
import importlib.util
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ModelConfigError, closest_name
from .rules import KNOWN_TASKS

__all__ = [
    "ARCHITECTURE_TASKS",
    "checked_task",
    "config_mapping",
    "estimate_parameters",
    "normalise_task",
    "parse_parameter_count",
    "read_config",
    "resolve_pretrained",
    "task_from_architectures",
]

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
VOCAB_KEYS = ("vocab_size",)
POSITION_KEYS = ("max_position_embeddings", "n_positions")

TASK_ALIASES = {
    "causal-lm": "text-generation",
    "clm": "text-generation",
    "language-modeling": "text-generation",
    "sentiment-analysis": "text-classification",
    "sequence-classification": "text-classification",
    "qa": "question-answering",
    "masked-lm": "fill-mask",
    "mlm": "fill-mask",
    "ner": "token-classification",
}

ARCHITECTURE_TASKS = (
    ("ForCausalLM", "text-generation"),
    ("LMHeadModel", "text-generation"),
    ("ForSequenceClassification", "text-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMaskedLM", "fill-mask"),
    ("ForTokenClassification", "token-classification"),
    ("ForMultipleChoice", "multiple-choice"),
)
"""HF class-name suffix in a config's ``architectures`` -> task, first match wins."""

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"^([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)$")
_GROUPED = re.compile(r"[+-]?[0-9]{1,3}(?:,[0-9]{3})+(?![0-9_])")
"""An integer part in thousands: one to three digits, then groups of three after commas."""
_MAX_COUNT = decimal.Decimal("1e300")
"""The largest count taken: far past any model, yet low enough that the bytes it needs
(a few dozen per parameter at most) stay finite floats in ``show``, ``bench`` and the
memory budget, which overflowed near 1.8e308, the largest float."""
_LARGEST_FLOAT = decimal.Decimal(sys.float_info.max)


def normalise_task(task: str | None) -> str | None:
    """Canonical task name: case-insensitive, ``_`` = ``-``, known aliases folded.

    Args:
        task: what the user typed, or None.

    Returns:
        e.g. ``"Causal_LM"`` -> ``"text-generation"``; None stays None.
    """
    if task is None:
        return None
    folded = "-".join(task.strip().lower().replace("_", "-").split())
    return TASK_ALIASES.get(folded, folded)


def checked_task(task: str | None) -> str | None:
    """:func:`normalise_task`, refusing a name that is no known task (a typo).

    Args:
        task: what the user typed, or None.

    Returns:
        The canonical task name, or None.

    Raises:
        ModelConfigError: an unknown task, with the closest known one.
    """
    canonical = normalise_task(task)
    if canonical is None or canonical in KNOWN_TASKS:
        return canonical
    choices = sorted(KNOWN_TASKS | set(TASK_ALIASES))
    suggestion = closest_name(canonical, choices)
    hint = f"; did you mean {normalise_task(suggestion)!r}?" if suggestion else ""
    raise ModelConfigError(
        f"unknown task {task!r}{hint} (known tasks: {', '.join(sorted(KNOWN_TASKS))})"
    )


def parse_parameter_count(text: str | int | float) -> int:
    """A parameter count as people type it: ``7e9``, ``7B``, ``125M``, ``1.3b``, ``350k``, ``7,000,000``.

    Suffixes are decimal (k = 10^3, M = 10^6, B or G = 10^9, T = 10^12), any
    case; ``_`` separates digits, and ``,`` separates thousands only, in
    groups of three (``7,000,000``; ``7,00,0`` is refused). The arithmetic
    is exact (``1.3b`` is 1,300,000,000), and the result must be a whole
    number from 1 to 1e300 (``1e400``, not even finite as a float, is refused).

    Args:
        text: the count.

    Returns:
        The count.

    Raises:
        ModelConfigError: not a count, misplaced commas, not finite, above
            1e300, not whole, or not positive (naming ``--params`` and the value).
    """
    folded = str(text).strip().lower()
    if not _thousands_grouped(folded):
        raise _count_error(
            text, "has misplaced thousands separators (commas go between groups of three digits)"
        )
    found = _COUNT.match(folded.replace(",", "").replace("_", ""))
    if found is None:
        raise _count_error(text, "is not a parameter count")
    mantissa = decimal.Decimal(found.group(1))
    if mantissa <= 0:
        raise _count_error(text, "must be positive")
    # the exponent is checked before any arithmetic, so 1e999999999 costs nothing
    if mantissa.adjusted() > _MAX_COUNT.adjusted():
        raise _count_error(text, _too_large(mantissa))
    value = mantissa * _SUFFIXES[found.group(2)]
    if value > _MAX_COUNT:
        raise _count_error(text, _too_large(value))
    if value < 1 or value != value.to_integral_value():
        raise _count_error(text, "must be a whole number >= 1")
    return int(value)


def _thousands_grouped(folded: str) -> bool:
    """Whether every comma of ``folded`` separates thousands: ``7,000,000``, not ``7,00,0``."""
    if "," not in folded:
        return True
    grouped = _GROUPED.match(folded)
    return grouped is not None and "," not in folded[grouped.end() :]


def _too_large(count: decimal.Decimal) -> str:
    """Why a count above the largest taken is refused: not finite as a float, or too large."""
    if count > _LARGEST_FLOAT:
        return "is not finite (more than 1.8e308, the largest float)"
    return "is too large (the most is 1e300, so that the bytes it needs stay finite)"


def _count_error(text: str | int | float, reason: str) -> ModelConfigError:
    """The error for a bad ``--params``, naming it, the value and the accepted forms."""
    return ModelConfigError(
        f"--params {text!r} {reason}; e.g. 7e9, 7B, 125M, 1.3b, 350k or 7,000,000"
    )


def config_mapping(config: Any) -> dict[str, Any]:
    """A config as a plain dict: a mapping, or an object with ``to_dict()`` (``GPT2Config``).

    Raises:
        ModelConfigError: neither.
    """
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        converted = to_dict()
        if isinstance(converted, Mapping):
            return dict(converted)
    raise ModelConfigError(
        f"expected a config mapping, an object with to_dict() (e.g. transformers' "
        f"PretrainedConfig), or a path, not {type(config).__name__}"
    )


def task_from_architectures(config: Mapping[str, Any]) -> str | None:
    """The task an HF config's ``architectures`` names (``GPT2LMHeadModel`` -> text-generation).

    Args:
        config: the config mapping.

    Returns:
        The task of the first architecture with a known suffix, or None.
    """
    architectures = config.get("architectures")
    if not isinstance(architectures, (list, tuple)):
        return None
    for architecture in architectures:
        for suffix, task in ARCHITECTURE_TASKS:
            if isinstance(architecture, str) and architecture.endswith(suffix):
                return task
    return None


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def estimate_parameters(config: Mapping[str, Any]) -> tuple[int, bool]:
    """Parameter count N of a transformer from its config.

    ``num_parameters`` when the config gives it (exact); else the estimate
    ``12·L·h² + V·h (+ positions·h)`` from the usual key spellings. MoE and
    GQA fields are ignored.

    Args:
        config: an HF-style config mapping.

    Returns:
        ``(N, exact)``.

    Raises:
        ModelConfigError: neither ``num_parameters`` nor enough keys to estimate,
            naming every key looked for.
    """
    given = config.get("num_parameters")
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return given, True
    layers, hidden = _first(config, LAYER_KEYS), _first(config, HIDDEN_KEYS)
    vocab = _first(config, VOCAB_KEYS)
    if layers is None or hidden is None or vocab is None:
        missing = [
            "/".join(keys)
            for keys, found in ((LAYER_KEYS, layers), (HIDDEN_KEYS, hidden), (VOCAB_KEYS, vocab))
            if found is None
        ]
        message = (
            "cannot estimate the parameter count: the config has no num_parameters and lacks "
            f"{', '.join(missing)} (positive integers); keys present: {', '.join(sorted(config)) or 'none'}"
        )
        raise ModelConfigError(message)
    positions = _first(config, POSITION_KEYS) or 0
    return 12 * layers * hidden**2 + vocab * hidden + positions * hidden, False


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a ``config.json`` file (or a directory containing one).

    Args:
        path: the file, or a directory holding ``config.json``.

    Returns:
        The parsed JSON object.

    Raises:
        ModelConfigError: missing path, directory without ``config.json``,
            invalid JSON, or JSON that is not an object; the message names the path.
    """
    location = Path(path)
    if location.is_dir():
        location = location / "config.json"
        if not location.is_file():
            raise ModelConfigError(f"{path}: directory has no config.json")
    elif not location.exists():
        raise ModelConfigError(f"{path}: no such file or directory")
    try:
        loaded = json.loads(location.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelConfigError(f"{location}: not valid JSON ({error})") from error
    if not isinstance(loaded, dict):
        raise ModelConfigError(f"{location}: expected a JSON object, found {type(loaded).__name__}")
    return loaded


def resolve_pretrained(name_or_path: str | os.PathLike[str]) -> Path:
    """Find the ``config.json`` of a local path or, offline, of a cached hub model.

    Args:
        name_or_path: a directory, a ``config.json`` path, or a hub id such as
            ``"gpt2"`` (looked up only in the local Hugging Face cache, and only
            when ``huggingface_hub`` is installed).

    Returns:
        The path of the config file (or directory) to read.

    Raises:
        ModelConfigError: nothing found; the message says what to pass.
    """
    location = Path(name_or_path)
    if location.exists():
        return location
    cached = _hub_cache_config(str(name_or_path))
    if cached is not None:
        return cached
    if importlib.util.find_spec("huggingface_hub") is None:
        hint = "huggingface_hub is not installed, so hub ids cannot be looked up"
    else:
        hint = "it is not in the local Hugging Face cache (optiplug never downloads)"
    raise ModelConfigError(
        f"{name_or_path}: no such file or directory, and {hint}; pass a local directory "
        "containing config.json or the path of a config.json file"
    )


def _hub_cache_config(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache  # deferred: optional dependency
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an invalid repo id, say: treated as not cached
        return None
    return Path(found) if isinstance(found, str) else None
