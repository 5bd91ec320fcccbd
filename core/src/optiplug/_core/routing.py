"""Routing tables: which algorithm updates each parameter, and why.

Optimizers that split parameters between algorithms (``muon`` with its
auxiliary AdamW, ``multi``) return a :class:`Routing` from ``routing()``.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from .._text import format_table

__all__ = ["ParameterRoute", "Routing"]


@attrs.frozen
class ParameterRoute:
    """One row of a :class:`Routing`.

    Attributes:
        name: the parameter's name (``"#i"`` when unnamed).
        shape: its shape.
        algorithm: the algorithm that updates it.
        reason: why it went there.
        lr: the effective learning rate now.
        weight_decay: the weight decay applied to it.
        group: index of its param group in the optimizer.
        route: the route (``multi``) or sub-optimizer that owns it, if any.
    """

    name: str
    shape: tuple[int, ...]
    algorithm: str
    reason: str
    lr: float
    weight_decay: float
    group: int
    route: str = ""


@attrs.frozen
class Routing:
    """Per parameter, the algorithm that updates it, why, and its effective lr/wd.

    ``str()`` is a table; iterate for :class:`ParameterRoute` rows; index by
    parameter name.

    Attributes:
        routes: one row per parameter, in param-group order.
    """

    routes: tuple[ParameterRoute, ...]

    def __iter__(self) -> Iterator[ParameterRoute]:
        return iter(self.routes)

    def __len__(self) -> int:
        return len(self.routes)

    def __getitem__(self, name: str) -> ParameterRoute:
        """The row of parameter ``name``."""
        for route in self.routes:
            if route.name == name:
                return route
        raise KeyError(name)

    def names(self, algorithm: str) -> tuple[str, ...]:
        """Names of the parameters ``algorithm`` updates."""
        return tuple(r.name for r in self.routes if r.algorithm == algorithm)

    def __str__(self) -> str:
        header = ["parameter", "shape", "algorithm", "route", "lr", "wd", "reason"]
        rows = [
            [
                r.name,
                "x".join(map(str, r.shape)) or "scalar",
                r.algorithm,
                r.route or "-",
                f"{r.lr:.4g}",
                f"{r.weight_decay:.4g}",
                r.reason,
            ]
            for r in self.routes
        ]
        return format_table(header, rows)
