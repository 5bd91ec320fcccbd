"""The ``params`` argument of every optimizer: tensors, param-group dicts or ``(name, tensor)`` pairs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["GROUP_META_KEYS", "group_overrides", "parameter_tensors"]

GROUP_META_KEYS = frozenset({"params", "param_names"})
"""Keys of a param group that are not hyperparameters."""


def parameter_tensors(params: Iterable[Any]) -> list[torch.Tensor]:
    """Flatten any accepted ``params`` form into its tensors.

    Args:
        params: tensors, param-group dicts, or ``(name, tensor)`` pairs (also
            inside a group's ``"params"``).

    Returns:
        The parameter tensors in order.
    """
    import torch  # deferred: imports torch

    tensors: list[torch.Tensor] = []
    for item in params:
        if isinstance(item, Mapping):
            inner = item["params"]
            tensors += parameter_tensors([inner] if isinstance(inner, torch.Tensor) else inner)
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor):
            tensors.append(item[1])
        else:
            tensors.append(item)
    return tensors


def group_overrides(params: Sequence[Any]) -> list[dict[str, Any]]:
    """The per-group hyperparameter overrides in ``params`` (param-group dicts)."""
    return [
        {key: value for key, value in item.items() if key not in GROUP_META_KEYS}
        for item in params
        if isinstance(item, Mapping)
    ]
