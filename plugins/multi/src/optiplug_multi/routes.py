"""Routes: which parameters an algorithm of a ``multi`` optimizer gets (torch-free)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from optiplug.errors import HyperparameterError

__all__ = ["Assignment", "Route", "assign", "routes_from"]

_ROUTE_KEYS = ("algorithm", "match", "params", "name", "impl")

Matcher = str | Callable[[str, Any], bool]


def _to_hparams(value: Mapping[str, Any]) -> dict[str, Any]:
    return dict(value)


def _to_params(value: Iterable[Any] | None) -> tuple[Any, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen
class Route:
    """One algorithm over the parameters it matches.

    Attributes:
        algorithm: a registered algorithm name.
        match: a glob on the parameter name, ``"*"`` (everything left: the
            fallback), or a predicate ``(name, param) -> bool``. Ignored when
            ``params`` is given. A predicate gets the optimizer's tensor: for
            an FSDP2 ``DTensor`` its ``.shape`` is the global shape, the same
            on every rank.
        hparams: that algorithm's hyperparameters.
        params: an explicit list of parameter names or tensors, instead of ``match``.
        name: the route's name in state dicts and routing tables; defaults to
            the algorithm (numbered when several routes share one).
        impl: the implementation to force, or None.
    """

    algorithm: str
    match: Matcher = "*"
    hparams: dict[str, Any] = attrs.field(factory=dict, converter=_to_hparams)
    params: tuple[Any, ...] | None = attrs.field(default=None, converter=_to_params)
    name: str | None = None
    impl: str | None = None

    @classmethod
    def of(cls, value: Route | Mapping[str, Any], index: int) -> Route:
        """A route from a record or a dict (unknown keys are the algorithm's hyperparameters).

        Raises:
            HyperparameterError: no algorithm, a bad matcher, or both ``match`` and ``params``.
        """
        if isinstance(value, Route):
            route = value
        elif isinstance(value, Mapping):
            if not isinstance(value.get("algorithm"), str):
                raise _error(
                    index, "algorithm", value.get("algorithm"), "must name a registered algorithm"
                )
            if "match" in value and "params" in value:
                raise _error(
                    index, "match", value["match"], "give either match or params, not both"
                )
            known = {k: value[k] for k in _ROUTE_KEYS if k in value}
            route = cls(**known, hparams={k: v for k, v in value.items() if k not in _ROUTE_KEYS})
        else:
            raise _error(index, "", value, "a route is a dict or an optiplug_multi.Route")
        if route.params is None and not (isinstance(route.match, str) or callable(route.match)):
            raise _error(
                index,
                "match",
                route.match,
                "must be a glob string or a predicate (name, param) -> bool",
            )
        return route

    def describe(self) -> str:
        """How this route matches, for routing tables."""
        if self.params is not None:
            return "explicit parameter list"
        if callable(self.match):
            return f"predicate {getattr(self.match, '__name__', repr(self.match))}"
        return "fallback '*'" if self.match == "*" else f"glob {self.match!r}"

    def matches(self, name: str, param: Any) -> bool:
        """Whether this route's matcher (not its explicit list) takes the parameter."""
        if self.params is not None:
            return False
        if callable(self.match):
            return bool(self.match(name, param))
        return fnmatch.fnmatchcase(name, self.match)


def _error(index: int, field: str, value: Any, reason: str) -> HyperparameterError:
    where = f"routes[{index}]" + (f".{field}" if field else "")
    return HyperparameterError(where, value, reason, algorithm="multi")


def routes_from(values: Sequence[Route | Mapping[str, Any]]) -> tuple[Route, ...]:
    """Validate and name the routes (names made unique: ``adamw``, ``adamw_1``...).

    Raises:
        HyperparameterError: no routes, a bad route, or two routes with one name.
    """
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence) or not values:
        raise HyperparameterError(
            "routes", values, "must be a non-empty list of routes", algorithm="multi"
        )
    routes: list[Route] = []
    seen: set[str] = set()
    for index, value in enumerate(values):
        route = Route.of(value, index)
        name = route.name or _unused(route.algorithm, seen)
        if name in seen:
            raise _error(index, "name", name, "route names must be unique")
        seen.add(name)
        routes.append(attrs.evolve(route, name=name))
    return tuple(routes)


def _unused(base: str, seen: set[str]) -> str:
    name, number = base, 0
    while name in seen:
        number += 1
        name = f"{base}_{number}"
    return name


@attrs.frozen
class Assignment:
    """Where one parameter went: the route index and why."""

    name: str
    route: int
    reason: str


def assign(named: Sequence[tuple[str, Any]], routes: Sequence[Route]) -> list[Assignment]:
    """Route every parameter: explicit lists first, then the first matching matcher.

    Raises:
        HyperparameterError: a parameter in two explicit lists, an explicit
            entry that is not a parameter, or a parameter no route takes.
    """
    explicit = _explicit(named, routes)
    found: list[Assignment] = []
    for name, param in named:
        if name in explicit:
            owner = explicit[name]
            found.append(Assignment(name, owner, f"listed in route {routes[owner].name!r}"))
            continue
        index = next((i for i, r in enumerate(routes) if r.matches(name, param)), None)
        if index is None:
            reason = "no route matches it; add a fallback route with match='*'"
            raise HyperparameterError("routes", name, reason, algorithm="multi")
        found.append(
            Assignment(name, index, f"{routes[index].describe()} (route {routes[index].name!r})")
        )
    return found


def _explicit(named: Sequence[tuple[str, Any]], routes: Sequence[Route]) -> dict[str, int]:
    by_name = {name: name for name, _ in named}
    by_id = {id(param): name for name, param in named}
    owner: dict[str, int] = {}
    for index, route in enumerate(routes):
        for entry in route.params or ():
            name = by_name.get(entry) if isinstance(entry, str) else by_id.get(id(entry))
            if name is None:
                raise _error(
                    index,
                    "params",
                    entry if isinstance(entry, str) else "<tensor>",
                    "is not one of the parameters",
                )
            if name in owner:
                reason = f"parameter {name!r} is in the explicit lists of routes {routes[owner[name]].name!r} and {route.name!r}"
                raise _error(index, "params", name, reason)
            owner[name] = index
    return owner
