"""Reading model configs (HF-style ``config.json``) and estimating parameter counts."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ModelConfigError

__all__ = [
    "estimate_parameters",
    "normalise_task",
    "read_config",
    "resolve_pretrained",
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
}


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
