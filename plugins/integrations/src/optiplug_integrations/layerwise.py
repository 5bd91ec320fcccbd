"""Layer-wise training: one optimizer per parameter, stepped as soon as its gradient is ready.

A :class:`LayerwiseOptimizer` holds one optimizer per trainable parameter and
steps it, then sets its gradient to None, from the parameter's
``register_post_accumulate_grad_hook``: during the backward pass, one
parameter at a time, so that no more than one parameter's gradient need be
alive at once (what transformers' ``*_layerwise`` optimizers do)::

    from optiplug_integrations.layerwise import layerwise

    optimizer = layerwise(lambda group: optiplug.create("adamw", group, lr=1e-3),
                          model.named_parameters())
    loss.backward()  # every parameter has stepped
    scheduler.step()  # any torch LRScheduler made on it reaches every parameter

Unlike transformers' ``LayerWiseDummyOptimizer``, it is the optimizer to
schedule and to checkpoint: its ``param_groups`` are the per-parameter
optimizers' own group dicts (the same objects), so a scheduler made on it
sets every parameter's ``lr``; its ``state_dict()`` is a torch-format state
dict over all of them (one group per parameter, numbered in order), and
``load_state_dict`` restores every one, all or nothing. ``step()`` steps
nothing (the backward did) and ``zero_grad()`` finds no gradient left.

A parameter is driven by one layer-wise optimizer at a time: making another
over a parameter detaches the earlier optimizer (removes all its hooks, so
two Trainers built over one model do not step it twice), as does
:meth:`LayerwiseOptimizer.detach`; the hooks also go when the optimizer is
garbage collected. It is neither copied nor pickled (a copy would have no
hooks): save its state dict and load it into one made over the copy.

Gradient accumulation cannot be served: each backward steps every
parameter. Neither can a gradient scaler nor clipping by the global norm,
which act after the backward, when the parameters have already stepped.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch
from torch.utils.hooks import RemovableHandle

import optiplug as _api
from optiplug import Problem
from optiplug.errors import HyperparameterError, StateDictError

__all__ = ["LayerwiseOptimizer", "layerwise"]

_GROUPS = "layerwise-groups"
"""The problem kind of a state dict whose param groups do not match the per-parameter optimizers."""

_DRIVERS: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[LayerwiseOptimizer]]] = {}
"""``id(parameter)`` -> (the parameter, the layer-wise optimizer whose hook steps it)."""


class _StateUnion(Mapping[torch.Tensor, Any]):
    """The per-parameter optimizers' ``state`` mappings, read as one (a live view)."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self._optimizers = optimizers

    def __getitem__(self, param: torch.Tensor) -> Any:
        for optimizer in self._optimizers:
            if param in optimizer.state:
                return optimizer.state[param]
        raise KeyError(param)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for optimizer in self._optimizers:
            yield from optimizer.state

    def __len__(self) -> int:
        return sum(len(optimizer.state) for optimizer in self._optimizers)


class LayerwiseOptimizer(torch.optim.Optimizer):
    """Per-parameter optimizers stepped from gradient hooks, scheduled and saved as one.

    Attributes:
        optimizer_dict: parameter -> the optimizer that steps it (as in
            transformers' ``LayerWiseDummyOptimizer``).
        optimizers: the per-parameter optimizers, in parameter order.
        attached: whether the hooks are in place (False after :meth:`detach`).
    """

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Drive ``optimizers`` from their parameters' post-accumulate-grad hooks.

        Args:
            optimizers: one optimizer per parameter, each holding exactly one
                parameter that requires grad, no two the same.

        Raises:
            HyperparameterError: no optimizer, one holding no parameter or several,
                one that does not require grad, or one another also holds;
                nothing is hooked.
        """
        self.optimizers = tuple(optimizers)
        if not self.optimizers:
            raise HyperparameterError("optimizers", 0, "a layer-wise optimizer needs one")
        params = [_sole_parameter(index, opt) for index, opt in enumerate(self.optimizers)]
        if len({id(p) for p in params}) != len(params):
            raise HyperparameterError("optimizers", len(params), "two hold the same parameter")
        self.optimizer_dict = dict(zip(params, self.optimizers, strict=True))
        self._built = False
        super().__init__([g for opt in self.optimizers for g in opt.param_groups], {})
        self._built = True
        self.state = _StateUnion(self.optimizers)  # type: ignore[assignment]
        self._handles: list[RemovableHandle] = []
        for param, optimizer in self.optimizer_dict.items():
            hook = _stepper(weakref.ref(optimizer))
            handle = param.register_post_accumulate_grad_hook(hook)  # type: ignore[no-untyped-call]
            self._handles.append(handle)
        weakref.finalize(self, _remove, self._handles)
        _take_over(self, params)

    @property
    def attached(self) -> bool:
        """Whether the backward pass steps the parameters (the hooks are in place)."""
        return bool(self._handles)

    def detach(self) -> None:
        """Remove every hook: the backward no longer steps; the state stays (to save or load)."""
        _remove(self._handles)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Refuse to be copied or pickled: the hooks are on the model's own parameters.

        Raises:
            TypeError: always; save :meth:`state_dict` and load it into a new one.
        """
        raise TypeError(
            "a LayerwiseOptimizer is not copied or pickled (its hooks are on the model's "
            "parameters): save its state_dict() and load it into one made over the copy"
        )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Share a per-parameter optimizer's group dict (construction only).

        Raises:
            HyperparameterError: after construction: the parameters are fixed.
        """
        if self._built:
            raise HyperparameterError(
                "param_group", "<new group>", "a layer-wise optimizer's parameters are fixed "
                "when it is made: make another over the new parameters"
            )  # fmt: skip
        self.param_groups.append(param_group)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step nothing: each parameter stepped in the backward pass.

        Args:
            closure: evaluated (with grad enabled) when given: its backward
                steps the parameters; its loss is returned.
        """
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero what gradients remain (none do after a backward: each hook cleared its own)."""
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """A torch-format state dict over every per-parameter optimizer, numbered in order."""
        state: dict[int, Any] = {}
        groups: list[dict[str, Any]] = []
        for optimizer in self.optimizers:
            offset = sum(len(group["params"]) for group in groups)
            saved = optimizer.state_dict()
            unknown = sorted(set(saved) - {"state", "param_groups"})
            if unknown:  # load could not give it back: refuse to write it
                raise StateDictError(
                    [Problem(slot=unknown[0], kind="key", expected="state, param_groups")],
                    header=f"cannot save {type(optimizer).__name__} layer-wise",
                )
            state.update({offset + index: slots for index, slots in saved["state"].items()})
            groups += [
                {**group, "params": [offset + index for index in group["params"]]}
                for group in saved["param_groups"]
            ]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a :meth:`state_dict` into every per-parameter optimizer, all or nothing.

        Raises:
            StateDictError: any problem; every optimizer is left unchanged.
        """
        _api.load_state_dict(self, state_dict, strict=True)

    def optiplug_validate_state_dict(self, state_dict: Any) -> list[Problem]:
        """Every per-parameter optimizer's problems with its part (``optiplug.validate_state_dict``)."""
        problems, parts = self._split(state_dict)
        offset = 0
        for optimizer, part in zip(self.optimizers, parts, strict=False):
            found = _api.validate_state_dict(optimizer, part)
            problems += [_shifted(problem, offset) for problem in found]
            offset += len(optimizer.param_groups)
        return sorted(problems)

    def optiplug_load_state_dict(
        self, state_dict: Any, *, strict: bool = True, extra_problems: Iterable[Problem] = ()
    ) -> list[Problem]:
        """Validate every part, then load them all, or restore every optimizer as it was.

        Called by ``optiplug.load_state_dict`` after its whole-dict checks.

        Raises:
            StateDictError: a problem (``strict=True``), or param groups that do
                not match the per-parameter optimizers; nothing is changed.
        """
        problems = self.optiplug_validate_state_dict(state_dict) + list(extra_problems)
        if any(p.kind == _GROUPS for p in problems) or (strict and problems):
            header = "cannot load this state dict into a layer-wise optimizer; nothing was changed"
            raise StateDictError(sorted(problems), header=header)
        notes: list[Problem] = [] if strict else list(extra_problems)
        before = [_snapshot(optimizer) for optimizer in self.optimizers]
        try:
            offset = 0
            for optimizer, part in zip(self.optimizers, self._split(state_dict)[1], strict=True):
                found = _api.load_state_dict(optimizer, part, strict=strict)
                notes += [_shifted(problem, offset) for problem in found]
                offset += len(optimizer.param_groups)
        except BaseException:
            for optimizer, snapshot in zip(self.optimizers, before, strict=True):
                _restore(optimizer, snapshot)
            raise
        finally:  # loading may replace the group dicts: share the current ones again
            self.param_groups[:] = [g for opt in self.optimizers for g in opt.param_groups]
        return sorted(notes)

    def _split(self, state_dict: Any) -> tuple[list[Problem], list[dict[str, Any]]]:
        """(problems, each optimizer's part of ``state_dict``, numbered from 0)."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, Mapping) else None
        state = state_dict.get("state") if isinstance(state_dict, Mapping) else None
        if not isinstance(groups, list) or not isinstance(state, Mapping):
            return [Problem(kind=_GROUPS, expected="state and param_groups")], []
        wanted = [len(optimizer.param_groups) for optimizer in self.optimizers]
        if len(groups) != sum(wanted) or not all(isinstance(g, Mapping) for g in groups):
            expected = f"{sum(wanted)} param groups (one optimizer per parameter)"
            return [Problem(kind=_GROUPS, expected=expected, found=str(len(groups)))], []
        parts, start = [], 0
        for count in wanted:
            parts.append(_part(state, groups[start : start + count]))
            start += count
        return [], parts


def layerwise(
    create: Callable[[list[dict[str, Any]]], torch.optim.Optimizer], params: Iterable[Any]
) -> LayerwiseOptimizer:
    """A :class:`LayerwiseOptimizer` with one ``create([group])`` per parameter of ``params``.

    Args:
        create: makes an optimizer over a list of param groups (such as
            ``lambda groups: optiplug.create("adamw", groups, lr=1e-3)``).
        params: tensors, ``(name, tensor)`` pairs, or param groups of them;
            each parameter's group keeps its group's other keys (``weight_decay``...).

    Returns:
        The layer-wise optimizer, hooked.

    Raises:
        HyperparameterError: a parameter does not require grad, or none is given.
    """
    given = list(params)
    groups = given if given and isinstance(given[0], Mapping) else [{"params": given}]
    singles = [
        {**{k: v for k, v in group.items() if k != "params"}, "params": [param]}
        for group in groups
        for param in group["params"]
    ]
    if not singles:
        raise HyperparameterError("params", 0, "a layer-wise optimizer needs a parameter")
    for single in singles:
        entry = single["params"][0]
        tensor = entry[1] if isinstance(entry, tuple) else entry
        if not tensor.requires_grad:
            name = entry[0] if isinstance(entry, tuple) else f"#{singles.index(single)}"
            raise HyperparameterError("params", name, "does not require grad: no hook fires")
    return LayerwiseOptimizer(create([single]) for single in singles)


def _sole_parameter(index: int, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The one parameter ``optimizer`` holds.

    Raises:
        HyperparameterError: it holds none or several, or one that does not require grad.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len(params) != 1:
        raise HyperparameterError(
            f"optimizers[{index}]", f"{len(params)} parameters", "each must hold exactly one"
        )
    if not params[0].requires_grad:
        raise HyperparameterError(f"optimizers[{index}]", "requires_grad=False", "no hook fires")
    param: torch.Tensor = params[0]
    return param


def _stepper(ref: weakref.ref[torch.optim.Optimizer]) -> Callable[[torch.Tensor], None]:
    """The hook: step the parameter's optimizer (if it still exists), then drop its gradient."""

    def step(param: torch.Tensor) -> None:
        optimizer = ref()
        if optimizer is not None and param.grad is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def _remove(handles: list[RemovableHandle]) -> None:
    """Remove the hooks (again harmlessly) and forget them."""
    for handle in handles:
        handle.remove()
    handles.clear()


def _take_over(driver: LayerwiseOptimizer, params: Sequence[torch.Tensor]) -> None:
    """Make ``driver`` the one that steps ``params``: detach whichever stepped one of them."""
    for param in params:
        entry = _DRIVERS.get(id(param))
        earlier = entry[1]() if entry is not None and entry[0]() is param else None
        if earlier is not None and earlier is not driver:
            earlier.detach()
        _DRIVERS[id(param)] = (weakref.ref(param), weakref.ref(driver))
    for key, (param_ref, driver_ref) in list(_DRIVERS.items()):
        if param_ref() is None or driver_ref() is None:
            del _DRIVERS[key]


def _part(state: Mapping[Any, Any], groups: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One optimizer's state dict: its groups, their ids renumbered from 0 by position."""
    part_state: dict[int, Any] = {}
    part_groups: list[dict[str, Any]] = []
    for group in groups:
        start = sum(len(g["params"]) for g in part_groups)
        saved = list(group.get("params", ()))
        local = list(range(start, start + len(saved)))
        part_state.update({at: state[i] for i, at in zip(saved, local, strict=True) if i in state})
        part_groups.append({**group, "params": local})
    return {"state": part_state, "param_groups": part_groups}


def _shifted(problem: Problem, offset: int) -> Problem:
    """``problem`` of a part, its group numbered as in the whole state dict."""
    return problem if problem.group < 0 else attrs.evolve(problem, group=problem.group + offset)


_Snapshot = tuple[dict[str, Any], list[tuple[dict[Any, Any], dict[Any, Any]]]]


def _snapshot(optimizer: torch.optim.Optimizer) -> _Snapshot:
    """The optimizer's attributes and the contents of its state entries and group dicts.

    Loading builds new tensors and swaps them in (it writes into none it
    found), so putting these containers back restores the optimizer exactly.
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
