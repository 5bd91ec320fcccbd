"""``MultiOptimizer``: several registered algorithms as one ``torch.optim.Optimizer``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

import optiplug
from optiplug import ParameterRoute, Problem, Routing
from optiplug.base import closure_loss, count_layers
from optiplug.errors import HyperparameterError, StateDictError

from .routes import Assignment, Route, assign, routes_from

__all__ = ["MultiOptimizer"]

_ROUTING_KEYS = ("route", "algorithm")


def _named(params: Iterable[Any]) -> list[tuple[str, torch.Tensor]]:
    named = []
    for index, item in enumerate(params):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            named.append(item)
        elif isinstance(item, torch.Tensor):
            named.append((f"#{index}", item))
        else:
            reason = "multi takes tensors or (name, tensor) pairs; put per-group settings in routes"
            raise HyperparameterError("params", type(item).__name__, reason, algorithm="multi")
    names = [name for name, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise HyperparameterError(
            "params", duplicates, "parameter names must be unique", algorithm="multi"
        )
    return named


class MultiOptimizer(torch.optim.Optimizer):
    """Several algorithms over disjoint parameter sets, stepped as one optimizer.

    ``param_groups`` is the union of the sub-optimizers' groups (the same
    dicts), so torch LR schedulers, optiplug schedules and ``Graph.set_lr``
    reach every sub-optimizer; ``step``/``zero_grad`` reach all; the state
    dict is torch-shaped (global parameter indices) with each group tagged by
    its ``route`` and ``algorithm``, and loading validates each route with
    its own algorithm's rules. FSDP2 ``DTensor`` parameters are routed like
    any others, by their names and global shapes (``routing()`` reports
    those); each route's algorithm steps them (``muon`` raises, naming the
    parameter, for a placement it cannot orthogonalise).

    Args:
        params: ``(name, tensor)`` pairs (``model.named_parameters()``) or
            tensors (named ``#i``).
        routes: dicts or :class:`~optiplug_multi.Route` records, first match wins.
        registry: where the routes' algorithms are looked up: the registry
            that creates ``multi`` (``Registry.create`` passes itself, as
            ``multi`` declares the ``"uses-registry"`` capability), else the
            default registry.
        model: the module the parameters come from; passed to every
            route's algorithm, for ``no_decay="auto"`` (norms and embeddings
            by module type) and for algorithms that take it (``muon``).
        no_decay: every route's default ``no_decay`` (a route's own wins):
            ``"auto"`` or globs; see :func:`optiplug.base.param_groups`.
        layer_decay: every route's default ``layer_decay`` (a route's own
            wins); layer ids are counted over all the parameters, so every
            route scales by the same depth.
        num_layers: override of the layer count (default: from all names).

    Raises:
        HyperparameterError: a bad route, a parameter no route takes, or bad
            hyperparameters for a route's algorithm (nothing is built).
    """

    algorithm = "multi"

    def __init__(
        self,
        params: Iterable[Any],
        routes: Sequence[Any],
        *,
        registry: optiplug.Registry | None = None,
        model: torch.nn.Module | None = None,
        no_decay: str | Sequence[str] | None = None,
        layer_decay: float | None = None,
        num_layers: int | None = None,
    ) -> None:
        if isinstance(params, torch.nn.Module):  # built directly from a module
            model = params if model is None else model
            params = params.named_parameters()
        named = _named(params)
        records = routes_from(routes)
        assignments = assign(named, records)
        if registry is None:  # built directly, not by a registry ("uses-registry")
            registry = optiplug.default_registry()
        self._optimizers: dict[str, torch.optim.Optimizer] = {}
        shared = _shared_grouping(named, records, model, no_decay, layer_decay, num_layers)
        built = _build(named, records, assignments, registry, shared)
        super().__init__([p for _, p in named], {})
        self._optimizers = built
        self._routes = {route.name: route.algorithm for route in records if route.name in built}
        self._reasons = {a.name: a.reason for a in assignments}

    # torch's base class assigns these in __init__; ours are views of the sub-optimizers.
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The sub-optimizers' param groups (the same dicts), in route order."""
        return [
            group for optimizer in self._optimizers.values() for group in optimizer.param_groups
        ]

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        """Ignored: torch's constructor sets it; the groups live in the sub-optimizers."""

    @property
    def state(self) -> defaultdict[torch.Tensor, Any]:
        """Every sub-optimizer's per-parameter state (a read-only merged view)."""
        merged: defaultdict[torch.Tensor, Any] = defaultdict(dict)
        for optimizer in self._optimizers.values():
            merged.update(optimizer.state)
        return merged

    @state.setter
    def state(self, value: Any) -> None:
        """Ignored: the state lives in the sub-optimizers."""

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The sub-optimizer of each route, by route name."""
        return dict(self._optimizers)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Only torch's constructor may add groups; route new parameters instead."""
        if not getattr(self, "_optimizers", None):
            return
        raise HyperparameterError(
            "param_group", sorted(param_group), "add parameters through a route", algorithm="multi"
        )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Step every sub-optimizer; ``closure`` is evaluated once."""
        loss = closure_loss(closure)
        for optimizer in self._optimizers.values():
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero every sub-optimizer's gradients."""
        for optimizer in self._optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def routing(self) -> Routing:
        """Per parameter: route, algorithm, why, and its lr/weight decay now."""
        rows = []
        for index, group in enumerate(self.param_groups):
            names = group.get("param_names") or [f"#{i}" for i in range(len(group["params"]))]
            for name, param in zip(names, group["params"], strict=True):
                route = _route_of(group, self._optimizers)
                rows.append(
                    ParameterRoute(
                        name=name,
                        shape=tuple(param.shape),
                        algorithm=self._routes[route],
                        reason=self._reasons.get(name, ""),
                        lr=float(group["lr"]),
                        weight_decay=float(group.get("weight_decay", 0.0)),
                        group=index,
                        route=route,
                    )
                )
        return Routing(tuple(rows))

    # ------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Torch-shaped: global parameter indices; each group tagged ``route``/``algorithm``."""
        state, groups, offset = {}, [], 0
        for route, optimizer in self._optimizers.items():
            saved = optimizer.state_dict()
            for group in saved["param_groups"]:
                params = [offset + i for i in group["params"]]
                groups.append(
                    {**group, "params": params, "route": route, "algorithm": self._routes[route]}
                )
            state.update({offset + i: slots for i, slots in saved["state"].items()})
            offset += sum(len(g["params"]) for g in optimizer.param_groups)
        return {"state": state, "param_groups": groups}

    def optiplug_validate_state_dict(self, state_dict: Any) -> list[Problem]:
        """Every problem of the routes: routing, then each route's own rules.

        Called by ``optiplug.validate_state_dict``, which adds the checks of
        the whole dict (top-level keys, id types, ids listed twice, even by
        two routes, orphan state); each route's part holds the entries of
        its listed ids, so a duplicated id is checked in every route.
        """
        problems, parts = self._split(state_dict)
        for route, part in parts.items():
            for problem in optiplug.validate_state_dict(self._optimizers[route], part):
                problems.append(_in_route(route, problem))
        return sorted(problems)

    def optiplug_load_state_dict(
        self, state_dict: Any, *, strict: bool = True, extra_problems: Iterable[Problem] = ()
    ) -> list[Problem]:
        """Validate every route, then load them all, or nothing.

        Called by ``optiplug.load_state_dict``, which has refused a dict whose
        whole structure is broken (ill-typed or duplicated ids) and passes the
        rest of its whole-dict problems as ``extra_problems``. If a route
        fails after validation, every route gets back, by plain copy, the
        state and param groups it had (see :func:`_snapshot`).

        Raises:
            StateDictError: any problem (``strict=True``), or a routing problem;
                every sub-optimizer is left unchanged.
        """
        problems = self.optiplug_validate_state_dict(state_dict) + list(extra_problems)
        routing = [p for p in problems if p.kind.startswith("route")]
        if routing or (strict and problems):
            raise StateDictError(
                sorted(problems),
                header="cannot load this state dict into multi; nothing was changed",
            )
        _, parts = self._split(state_dict)
        before = {route: _snapshot(opt) for route, opt in self._optimizers.items()}
        notes: list[Problem] = [] if strict else list(extra_problems)
        try:
            for route, part in parts.items():
                found = optiplug.load_state_dict(self._optimizers[route], part, strict=strict)
                notes += [_in_route(route, p) for p in found]
        except BaseException:
            for route, snapshot in before.items():
                _restore(self._optimizers[route], snapshot)
            raise
        return sorted(notes)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict from :meth:`state_dict`, all-or-nothing (see ``optiplug.load_state_dict``)."""
        optiplug.load_state_dict(self, state_dict, strict=True)

    def _split(self, state_dict: Any) -> tuple[list[Problem], dict[str, dict[str, Any]]]:
        problems = _structure_problems(state_dict)
        if problems:
            return problems, {}
        by_route: dict[str, list[dict[str, Any]]] = {}
        for group in state_dict["param_groups"]:
            by_route.setdefault(group["route"], []).append(group)
        problems = self._routing_problems(by_route)
        parts = {
            route: _part(state_dict["state"], groups)
            for route, groups in by_route.items()
            if route in self._optimizers
        }
        return problems, ({} if problems else parts)

    def _routing_problems(self, saved: Mapping[str, list[dict[str, Any]]]) -> list[Problem]:
        problems = []
        for route, algorithm in self._routes.items():
            if route not in saved:
                problems.append(
                    Problem(
                        slot=route,
                        kind="route-missing",
                        expected=f"route {route!r} ({algorithm})",
                        found="no such route in the state dict",
                    )
                )
                continue
            found = saved[route][0].get("algorithm")
            if found != algorithm:
                problems.append(
                    Problem(
                        slot=route,
                        kind="route-algorithm",
                        expected=f"route {route!r} using {algorithm}",
                        found=f"route {route!r} using {found}",
                    )
                )
        for route in saved:
            if route not in self._routes:
                problems.append(
                    Problem(
                        slot=route,
                        kind="route-unexpected",
                        expected=f"routes {sorted(self._routes)}",
                        found=f"route {route!r}",
                    )
                )
        return problems

    def __getstate__(self) -> dict[str, Any]:
        return {
            "_optimizers": self._optimizers,
            "_routes": self._routes,
            "_reasons": self._reasons,
            "defaults": self.defaults,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        super().__setstate__({"defaults": state["defaults"]})


def _shared_grouping(
    named: Sequence[tuple[str, torch.Tensor]],
    routes: Sequence[Route],
    model: torch.nn.Module | None,
    no_decay: str | Sequence[str] | None,
    layer_decay: float | None,
    num_layers: int | None,
) -> dict[str, Any]:
    """The grouping keywords every route's ``create`` gets (its own hparams win).

    ``num_layers`` is counted over all the parameters, not a route's share,
    when any route uses ``layer_decay``: a route holding only the embeddings
    and the head must scale them as the whole model's depth says.
    """
    shared: dict[str, Any] = {"model": model, "no_decay": no_decay, "layer_decay": layer_decay}
    uses_layers = layer_decay is not None or any(
        r.hparams.get("layer_decay") is not None for r in routes
    )
    if num_layers is None and uses_layers and model is None:
        counted = count_layers(name for name, _ in named)
        num_layers = counted if counted > 1 else None
    shared["num_layers"] = num_layers
    return {key: value for key, value in shared.items() if value is not None}


def _build(
    named: Sequence[tuple[str, torch.Tensor]],
    routes: Sequence[Route],
    assignments: Sequence[Assignment],
    registry: optiplug.Registry,
    shared: Mapping[str, Any],
) -> dict[str, torch.optim.Optimizer]:
    built: dict[str, torch.optim.Optimizer] = {}
    for index, route in enumerate(routes):
        members = [
            (name, p) for (name, p), a in zip(named, assignments, strict=True) if a.route == index
        ]
        if members:
            assert route.name is not None  # routes_from names every route
            built[route.name] = registry.create(
                route.algorithm, members, impl=route.impl, **{**shared, **route.hparams}
            )
    return built


def _route_of(group: Mapping[str, Any], optimizers: Mapping[str, torch.optim.Optimizer]) -> str:
    return next(
        route for route, opt in optimizers.items() if any(g is group for g in opt.param_groups)
    )


def _structure_problems(state_dict: Any) -> list[Problem]:
    if not isinstance(state_dict, Mapping) or not isinstance(state_dict.get("param_groups"), list):
        return [
            Problem(
                kind="route-structure",
                expected="a multi state dict with param_groups",
                found=type(state_dict).__name__,
            )
        ]
    if not isinstance(state_dict.get("state"), Mapping):
        return [
            Problem(
                kind="route-structure",
                slot="state",
                expected="a mapping",
                found=type(state_dict.get("state")).__name__,
            )
        ]
    for index, group in enumerate(state_dict["param_groups"]):
        if not isinstance(group, Mapping) or not all(
            isinstance(group.get(k), str) for k in _ROUTING_KEYS
        ):
            return [
                Problem(
                    group=index,
                    kind="route-structure",
                    expected="groups tagged with route and algorithm",
                    found="an untagged group (not saved by multi?)",
                )
            ]
        if not isinstance(group.get("params"), list):
            return [
                Problem(
                    group=index,
                    slot="params",
                    kind="route-structure",
                    expected="a list",
                    found=type(group.get("params")).__name__,
                )
            ]
    return []


def _is_id(value: Any) -> bool:
    return isinstance(value, (int, str)) and not isinstance(value, bool)


def _part(state: Mapping[Any, Any], groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One route's state dict, numbered from 0 by position, as its sub-optimizer numbers it.

    Each position gets the entry of the id listed there (an id listed twice:
    both positions); ill-typed ids (reported on the whole dict) get none.
    """
    part_state: dict[int, Any] = {}
    part_groups: list[dict[str, Any]] = []
    for group in groups:
        start = sum(len(g["params"]) for g in part_groups)
        local = list(range(start, start + len(group["params"])))
        for saved, position in zip(group["params"], local, strict=True):
            if _is_id(saved) and saved in state:
                part_state[position] = state[saved]
        kept = {k: v for k, v in group.items() if k not in _ROUTING_KEYS}
        part_groups.append({**kept, "params": local})
    return {"state": part_state, "param_groups": part_groups}


_Snapshot = tuple[dict[str, Any], list[tuple[dict[Any, Any], dict[Any, Any]]]]


def _snapshot(optimizer: torch.optim.Optimizer) -> _Snapshot:
    """The optimizer's attributes, and the contents of its state entries and group dicts.

    Loading never writes into existing tensors (it builds copies and swaps
    them in), so restoring these containers restores the optimizer bit for
    bit, without validating anything.
    """
    containers: list[dict[Any, Any]] = [optimizer.state, *optimizer.state.values()]
    containers += optimizer.param_groups
    return dict(optimizer.__dict__), [(c, dict(c)) for c in containers]


def _restore(optimizer: torch.optim.Optimizer, snapshot: _Snapshot) -> None:
    """Put a :func:`_snapshot` back: the same objects, with the same contents."""
    attributes, containers = snapshot
    optimizer.__dict__.clear()
    optimizer.__dict__.update(attributes)
    for container, contents in containers:
        container.clear()
        container.update(contents)


def _in_route(route: str, problem: Problem) -> Problem:
    slot = f"{route}/{problem.slot}" if problem.slot else route
    return Problem(
        problem.group, problem.parameter, slot, problem.kind, problem.expected, problem.found
    )
