"""The ``params`` argument of every optimizer: tensors, param-group dicts or ``(name, tensor)`` pairs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import HyperparameterError

if TYPE_CHECKING:
    import torch

__all__ = [
    "GROUP_META_KEYS",
    "NamedParamGroup",
    "group_overrides",
    "named_param_groups",
    "parameter_tensors",
]

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


@attrs.frozen
class NamedParamGroup:
    """One param group of an optimizer's ``params``, with each tensor's name.

    Attributes:
        params: ``(name, tensor)`` pairs; the name is None when the input
            gave none (a bare tensor without ``param_names``).
        options: the group's hyperparameter overrides (every key of a
            param-group dict but ``params`` and ``param_names``).
    """

    params: tuple[tuple[str | None, torch.Tensor], ...]
    options: dict[str, Any] = attrs.field(factory=dict)

    @property
    def named(self) -> bool:
        """Whether every parameter of the group has a name."""
        return all(name is not None for name, _ in self.params)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The group's tensors, in order."""
        return [tensor for _, tensor in self.params]


def named_param_groups(params: Iterable[Any]) -> list[NamedParamGroup]:
    """Parse any accepted ``params`` form into groups of named tensors.

    Accepts what ``torch.optim.Optimizer`` accepts: tensors, ``(name,
    tensor)`` pairs (``model.named_parameters()``), or param-group dicts
    whose ``"params"`` is a tensor or a list of either, optionally with
    ``"param_names"``.

    Args:
        params: the optimizer's ``params`` argument.

    Returns:
        One :class:`NamedParamGroup` per param-group dict, or a single one
        for a flat list (none for an empty one).

    Raises:
        HyperparameterError: a group's ``param_names`` does not match its
            parameters one to one.
    """
    import torch  # deferred: imports torch

    items = list(params)
    if not items:
        return []
    groups = items if isinstance(items[0], Mapping) else [{"params": items}]
    parsed = []
    for group in groups:
        inner = group["params"]
        inner = [inner] if isinstance(inner, torch.Tensor) else list(inner)
        names = group.get("param_names") or [None] * len(inner)
        if len(names) != len(inner):
            raise HyperparameterError(
                "param_names", names, f"gives {len(names)} names for {len(inner)} parameters"
            )
        pairs = tuple(
            (item[0], item[1]) if isinstance(item, tuple) else (name, item)
            for name, item in zip(names, inner, strict=True)
        )
        options = {k: v for k, v in group.items() if k not in GROUP_META_KEYS}
        parsed.append(NamedParamGroup(pairs, options))
    return parsed


# These are public as optiplug.base.* (the plugin toolkit); report that home.
for _public in (NamedParamGroup, named_param_groups, parameter_tensors, group_overrides):
    _public.__module__ = "optiplug.base"
