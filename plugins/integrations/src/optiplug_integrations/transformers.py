"""optiplug optimizers in the Hugging Face ``Trainer``.

The ``Trainer`` builds its optimizer from ``optimizer_cls_and_kwargs=(cls,
kwargs)``: an optimizer class is called with HF's param groups, anything else
as ``cls()(model, **kwargs)``. This module gives the second form for any
registered algorithm, so the optimizer sees ``model.named_parameters()``
(names reach routing: Muon's embeddings and head go to its AdamW) and
``model=`` when the algorithm takes it::

    from optiplug_integrations.transformers import from_training_args, optimizer_cls_and_kwargs

    Trainer(model, args, optimizer_cls_and_kwargs=optimizer_cls_and_kwargs("muon", lr=0.02))
    Trainer(model, args, optimizer_cls_and_kwargs=from_training_args(args))  # args.optim

The Trainer keeps everything else: its lr scheduler, and saving and loading
the optimizer's ``state_dict`` in checkpoints. Weight decay follows the
Trainer's rule: biases and normalisation weights get none.

An optimizer that updates inside the backward pass (``lomo``, ``adalomo``:
it has ``fused_backward(loss, lr)``) is driven as transformers drives its own
LOMO: for ``TrainingArguments(optim="lomo")`` or ``"adalomo"`` the Trainer
passes ``learning_rate=`` to accelerate's ``Accelerator.backward``, which
hands it to ``fused_backward`` for the ``lomo_optim`` package's classes only,
and gives any other optimizer ``loss.backward(learning_rate=...)``, a
``TypeError``. Building such an optimizer here therefore wraps
``Accelerator.backward`` (once per process) so that it calls the
``fused_backward`` of the optiplug optimizers it prepared; every other call
goes to accelerate's own method unchanged. With any other ``optim`` the
Trainer calls a plain backward, and these optimizers update in ``step()``.

Importing this module imports torch and transformers; ``import optiplug``
never imports it.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
import torch
from torch import nn
from transformers import TrainingArguments
from transformers.training_args import OptimizerNames

import optiplug as _api
from optiplug import OptimizerFactory, Registry, record_of
from optiplug.errors import HyperparameterError, UnknownOptimizerError

from ._optim_args import (
    TARGET_GROUP_ARGS,
    TARGET_KEYWORDS,
    layerwise_caveat,
    read_optim_args,
    target_modules,
    typed_optim_args,
)
from .layerwise import layerwise

__all__ = [
    "HF_OPTIMIZERS",
    "HF_OPTIM_NAMES",
    "HFOptim",
    "HFRoute",
    "TrainerOptimizer",
    "decay_parameter_names",
    "drive_fused_backward",
    "from_training_args",
    "hf_optimizers",
    "optimizer_cls_and_kwargs",
    "target_parameter_names",
]


_Value = TypeVar("_Value")


@attrs.frozen
class HFRoute:
    """One way optiplug can serve a ``TrainingArguments.optim`` name.

    Attributes:
        name: the optiplug algorithm (qualified, ``plugin:name``, for a bridge's).
        impl: the implementation to force, or None to choose.
        caveat: how it differs from what the name means in transformers
            (said in a warning when this route is taken); "" when it is the same.
        adam_arguments: whether the Trainer's Adam settings are passed (see
            :attr:`optiplug.HFName.adam_arguments`).
        layerwise: whether it steps one optimizer per parameter from its
            gradient hook (a ``*_layerwise`` name, served by its base name's
            routes: :class:`~optiplug_integrations.layerwise.LayerwiseOptimizer`).
        target_modules: whether it is built over ``optim_target_modules`` (see
            :attr:`optiplug.HFName.target_modules`).
        decay_groups: whether it always gets the Trainer's two weight-decay
            groups (see :attr:`optiplug.HFName.decay_groups`).
    """

    name: str
    impl: str | None = None
    caveat: str = ""
    adam_arguments: bool = True
    layerwise: bool = False
    target_modules: bool = False
    decay_groups: bool = False


@attrs.frozen
class HFOptim:
    """How optiplug serves one ``TrainingArguments.optim`` name.

    Attributes:
        routes: the ways to serve it, best first; the first whose algorithm
            is installed is taken.
        served_by: the distributions that provide those algorithms, named
            in the error when none is installed.
        reason: why no optiplug plugin serves it (when ``routes`` is empty).
    """

    routes: tuple[HFRoute, ...] = ()
    served_by: tuple[str, ...] = ()
    reason: str = ""


_UNSERVABLE = (
    ("_xla", "it runs on XLA devices; optiplug runs on CPUs and CUDA"),
    ("_npu_", "it runs on Ascend NPUs; optiplug runs on CPUs and CUDA"),
)  # fmt: skip
"""``(part, reason)``: why no plugin can serve a transformers name holding ``part``."""

_UNDECLARED = "no plugin installed here declares it"

_LAYERWISE = "_layerwise"
"""The suffix of a name transformers steps layer-wise; what it ends is the base name."""


def hf_optimizers(registry: Registry | None = None) -> dict[str, HFOptim]:
    """Every ``TrainingArguments.optim`` name of transformers -> how ``registry`` serves it.

    A name is served by the algorithms whose specs declare it
    (:attr:`optiplug.OptimizerSpec.hf_names`), the highest priority first;
    a route with a caveat (32-bit state for a bitsandbytes name, no paging)
    warns when taken. An ``X_layerwise`` name is served by ``X``'s routes
    unless a spec declares it, stepped layer-wise either way
    (:attr:`HFRoute.layerwise`). ``served_by`` names the distributions of
    the default registry that declare it (what to install into another
    registry); a name none declares says why.

    Args:
        registry: the registry to read; the default registry when None.
    """
    found = registry if registry is not None else _api.default_registry()
    routes = _with_layerwise(_declared_routes(found))
    served = (
        _with_layerwise(_declared_routes(_api.default_registry()))
        if registry is not None
        else routes
    )
    return {
        optim: HFOptim(
            routes=tuple(route for *_, route in sorted(routes.get(optim, []), key=_rank)),
            served_by=tuple(
                dict.fromkeys(by for _, by, _ in sorted(served.get(optim, []), key=_rank))
            ),
            reason="" if optim in routes else _unserved_reason(optim),
        )
        for optim in dict.fromkeys([*(str(name.value) for name in OptimizerNames), *routes])
    }


def _declared_routes(registry: Registry) -> dict[str, list[tuple[int, str, HFRoute]]]:
    """``optim`` -> ``(-priority, distribution, route)`` for every name the specs declare."""
    found: dict[str, list[tuple[int, str, HFRoute]]] = {}
    for spec in registry.optimizer_specs():
        provider = spec.provider
        plugin = provider.plugin if provider is not None else ""
        name = f"{plugin}:{spec.name}" if spec.origin is not None else registry.name_of(spec)
        for hf in spec.hf_names:
            route = HFRoute(
                name,
                impl=hf.impl,
                caveat=hf.caveat,
                adam_arguments=hf.adam_arguments,
                target_modules=hf.target_modules,
                decay_groups=hf.decay_groups,
            )
            by = provider.distribution if provider is not None else plugin
            found.setdefault(hf.optim, []).append((-hf.priority, by, route))
    return found


def _with_layerwise(
    routes: dict[str, list[tuple[int, str, HFRoute]]],
) -> dict[str, list[tuple[int, str, HFRoute]]]:
    """``routes`` with every ``X_layerwise`` name layer-wise: its own routes, else ``X``'s."""
    added = dict(routes)
    for optim in dict.fromkeys([*(str(name.value) for name in OptimizerNames), *routes]):
        declared = routes.get(optim) or routes.get(optim.removesuffix(_LAYERWISE), [])
        if optim.endswith(_LAYERWISE) and declared:
            added[optim] = [(rank, by, attrs.evolve(r, layerwise=True)) for rank, by, r in declared]
    return added


def _rank(item: tuple[int, str, HFRoute]) -> tuple[int, str]:
    """Higher priority first, then by distribution."""
    return item[0], item[1]


def _unserved_reason(optim: str) -> str:
    """Why no algorithm serves ``optim``."""
    if optim.endswith(_LAYERWISE):
        base = optim.removesuffix(_LAYERWISE)
        return f"its base {base} is not served: {_unserved_reason(base)}"
    return next((why for part, why in _UNSERVABLE if part in optim), _UNDECLARED)


class _DefaultTable(Mapping[str, _Value]):
    """A read-only view of a table built from the default registry when read."""

    def __init__(self, build: Callable[[], Mapping[str, _Value]]) -> None:
        self._build = build

    def __getitem__(self, key: str) -> _Value:
        return self._build()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())


def _preferred(registry: Registry | None = None) -> dict[str, tuple[str, str | None]]:
    return {
        optim: (entry.routes[0].name, entry.routes[0].impl)
        for optim, entry in hf_optimizers(registry).items()
        if entry.routes
    }


HF_OPTIMIZERS: Mapping[str, HFOptim] = _DefaultTable(hf_optimizers)
"""Every ``TrainingArguments.optim`` name of transformers -> how the default registry
serves it (:func:`hf_optimizers`): read when looked at, so it follows what is installed."""

HF_OPTIM_NAMES: Mapping[str, tuple[str, str | None]] = _DefaultTable(_preferred)
"""``TrainingArguments.optim`` -> (its preferred optiplug algorithm, forced implementation or None)."""

_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")
"""Parameter names (lower-cased) the Trainer exempts from weight decay."""


def _route(optim: str, registry: Registry) -> HFRoute:
    """The first route of ``optim`` whose algorithm ``registry`` has.

    Raises:
        UnknownOptimizerError: ``optim`` is unknown, or none of its routes is
            installed (the message names the distributions that serve it),
            or no plugin serves it (the message says why).
    """
    table = hf_optimizers(registry)
    entry = table.get(optim)
    if entry is not None:
        for route in entry.routes:
            if registry.has(route.name):
                return route
    if entry is None:
        note = "transformers has no such name."
    elif entry.served_by:
        note = f"install {' or '.join(entry.served_by)}, whose plugin serves it."
    else:
        note = f"no optiplug plugin serves it: {entry.reason}."
    served = [name for name, e in table.items() if any(registry.has(r.name) for r in e.routes)]
    error = UnknownOptimizerError(optim, served, [note])
    error.message = f"TrainingArguments.optim={optim!r} is not supported: " + error.message
    raise error


def decay_parameter_names(model: nn.Module) -> set[str]:
    """The parameters the Trainer applies weight decay to (``Trainer.get_decay_parameter_names``).

    All but those inside an ``nn.LayerNorm`` and those whose lower-cased name
    contains ``bias``, ``layernorm``, ``rmsnorm`` or a ``norm``/``*_norm``
    component.
    """
    norms = [prefix + "." for prefix, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    return {
        name
        for name, _ in model.named_parameters()
        if not _NO_DECAY.search(name.lower()) and not any(name.startswith(n) for n in norms)
    }


def _targets_module(targets: str | tuple[str, ...], name: str) -> bool:
    """Whether module ``name`` is one of ``targets``, as transformers matches them.

    A string is a regular expression the whole name must match; a list
    matches a name it holds, a name holding one of its items, or a name one
    of its items matches in full as a regular expression.
    """
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return (
        name in targets
        or any(target in name for target in targets)
        or any(re.fullmatch(target, name) for target in targets)
    )


def target_parameter_names(model: nn.Module, targets: str | tuple[str, ...]) -> set[str]:
    """The weights of ``model``'s ``nn.Linear`` modules that ``optim_target_modules`` names.

    Matched as transformers matches them for GaLore and APOLLO (see
    ``_targets_module``); ``"all-linear"`` (or ``"all_linear"``) takes every
    ``nn.Linear``; a matched module of another type is left out, as there.

    Args:
        model: the module being trained.
        targets: ``TrainingArguments.optim_target_modules`` (a list as a tuple).

    Returns:
        The parameter names (``"<module>.weight"``).

    Raises:
        HyperparameterError: no ``nn.Linear`` module matches (field ``optim_target_modules``).
    """
    every = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    found = {
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and (every or _targets_module(targets, name))
    }
    if not found:
        shown = list(targets) if isinstance(targets, tuple) else targets
        raise HyperparameterError(
            "optim_target_modules", shown, "matches no nn.Linear module of the model"
        )
    return found


@attrs.frozen
class TrainerOptimizer:
    """The first element of ``optimizer_cls_and_kwargs``: ``TrainerOptimizer(f)()(model, **kw)``.

    The Trainer calls it with no arguments, then calls the result with the
    model and the (possibly empty) keywords. Build one with
    :func:`optimizer_cls_and_kwargs` or :func:`from_training_args`.

    Attributes:
        factory: the recipe: algorithm, hyperparameters, forced
            implementation, provider and registry.
        layerwise: build one optimizer per parameter, stepped from its
            gradient hook (:class:`~optiplug_integrations.layerwise.LayerwiseOptimizer`).
        target_modules: for a low-rank name (GaLore, APOLLO): the
            ``optim_target_modules`` whose ``nn.Linear`` weights form the
            projected group (:func:`target_parameter_names`); None otherwise.
        target_group: the keys of that group (``rank``, ``update_proj_gap``...).
        decay_groups: always the Trainer's two weight-decay groups, even when
            ``weight_decay`` is 0 (:attr:`optiplug.HFName.decay_groups`).
    """

    factory: OptimizerFactory
    layerwise: bool = False
    target_modules: str | tuple[str, ...] | None = None
    target_group: Mapping[str, Any] = attrs.field(factory=dict)
    decay_groups: bool = False

    def __call__(self) -> Callable[..., torch.optim.Optimizer]:
        """Return :meth:`build` (the Trainer instantiates "the class" first)."""
        return self.build

    def build(self, model: nn.Module, **hparams: Any) -> torch.optim.Optimizer:
        """Create the optimizer over ``model``'s trainable, named parameters.

        Parameters are passed as ``(name, tensor)`` pairs, in two param
        groups when a ``weight_decay`` applies (the Trainer's decay
        parameters with it, the rest with 0.0; always, with
        :attr:`decay_groups`); with :attr:`target_modules`, in the two groups
        transformers builds for GaLore and APOLLO instead (the other
        parameters, then the targets' weights with :attr:`target_group`).
        The algorithm also gets ``model=`` when it takes that hyperparameter
        (``muon``). Layer-wise, each parameter gets an optimizer of its own
        over its group's settings.

        Args:
            model: the module being trained.
            **hparams: hyperparameters overriding the factory's.

        Returns:
            The optimizer.
        """
        recipe = self.factory
        registry = recipe.registry if isinstance(recipe.registry, Registry) else None
        registry = registry if registry is not None else _api.default_registry()
        merged = {**recipe.hparams, **hparams}
        spec = registry.spec(recipe.name, provider=recipe.provider)
        accepted = {h.name for h in spec.hyperparameters}
        if "model" in accepted and merged.get("model") is None:
            merged["model"] = model
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        weight_decay = merged.get("weight_decay", 0.0) if "weight_decay" in accepted else 0.0
        params: list[Any] = named
        if self.target_modules is not None:
            targets = target_parameter_names(model, self.target_modules)
            params = [
                {"params": [(n, p) for n, p in named if n not in targets]},
                {"params": [(n, p) for n, p in named if n in targets], **self.target_group},
            ]
        elif weight_decay or (self.decay_groups and "weight_decay" in accepted):
            decay = decay_parameter_names(model)
            params = [
                {"params": [(n, p) for n, p in named if n in decay], "weight_decay": weight_decay},
                {"params": [(n, p) for n, p in named if n not in decay], "weight_decay": 0.0},
            ]
            params = [group for group in params if group["params"]]
        if self.layerwise:
            chosen = registry
            return layerwise(
                lambda group: chosen.create(
                    recipe.name, group, impl=recipe.impl, provider=recipe.provider, **merged
                ),
                params,
            )
        optimizer = registry.create(
            recipe.name, params, impl=recipe.impl, provider=recipe.provider, **merged
        )
        if callable(getattr(optimizer, "fused_backward", None)):
            drive_fused_backward()
        return optimizer


_DRIVES_FUSED = "_optiplug_drives_fused_backward"
"""Marks accelerate's ``Accelerator.backward`` once :func:`drive_fused_backward` has wrapped it."""


def drive_fused_backward() -> None:
    """Make accelerate's ``Accelerator.backward`` drive optiplug's fused-backward optimizers.

    Given ``learning_rate=`` (the Trainer's ``optim="lomo"`` and
    ``"adalomo"``), and with neither a gradient scaler, DeepSpeed, Megatron-LM
    nor a ``lomo_optim`` optimizer in play, the wrapped method divides the loss
    by the gradient accumulation steps, as accelerate does, and calls
    ``fused_backward(loss, learning_rate)`` of each optimizer optiplug built
    that the accelerator prepared; every other call is accelerate's own.
    Wrapping twice is a no-op; without accelerate, nothing happens.
    :meth:`TrainerOptimizer.build` calls it for such an optimizer.
    """
    try:
        from accelerate import Accelerator  # type: ignore[import-untyped]  # deferred: optional dependency
    except ImportError:  # no accelerate, no Trainer to drive
        return
    if not getattr(Accelerator.backward, _DRIVES_FUSED, False):
        Accelerator.backward = _fused_aware(Accelerator.backward)


def _fused_aware(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (``Accelerator.backward``), calling optiplug's ``fused_backward`` where due."""

    @functools.wraps(original)
    def backward(self: Any, loss: torch.Tensor, **kwargs: Any) -> Any:
        rate = kwargs.get("learning_rate")
        fused = _fused_optimizers(self) if rate is not None and _plain(self) else []
        if not fused:
            return original(self, loss, **kwargs)
        loss = loss / self.gradient_accumulation_steps
        for optimizer in fused:
            optimizer.fused_backward(loss, rate)
        return None

    setattr(backward, _DRIVES_FUSED, True)
    return backward


def _plain(accelerator: Any) -> bool:
    """Whether accelerate would call a bare ``loss.backward`` here (no scaler, DeepSpeed, LOMO)."""
    from accelerate.utils import DistributedType  # type: ignore[import-untyped]  # deferred: optional dependency

    special = (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)
    return (
        getattr(accelerator, "scaler", None) is None
        and not getattr(accelerator, "has_lomo_optimizer", False)
        and accelerator.distributed_type not in special
    )


def _fused_optimizers(accelerator: Any) -> list[Any]:
    """The optimizers optiplug built with a ``fused_backward`` that ``accelerator`` prepared."""
    found = []
    for prepared in getattr(accelerator, "_optimizers", ()):
        inner = getattr(prepared, "optimizer", prepared)
        if record_of(inner) is not None and callable(getattr(inner, "fused_backward", None)):
            found.append(inner)
    return found


def optimizer_cls_and_kwargs(
    name: str | OptimizerFactory,
    *,
    impl: str | None = None,
    provider: str | None = None,
    registry: Registry | None = None,
    **hparams: Any,
) -> tuple[TrainerOptimizer, dict[str, Any]]:
    """What ``Trainer(optimizer_cls_and_kwargs=...)`` takes, for any optiplug algorithm.

    Args:
        name: an algorithm name, or a ready :class:`~optiplug.OptimizerFactory`
            (such as an ``AutoOptimizer`` :class:`~optiplug.Selection`), used
            as is (then no other argument may be given).
        impl: implementation to force, or None to choose.
        provider: plugin or distribution that must provide ``name``.
        registry: where to look ``name`` up; the default registry when None.
        **hparams: hyperparameters; the Trainer's ``learning_rate`` and
            ``weight_decay`` are *not* read (give ``lr=`` here, or use
            :func:`from_training_args`).

    Returns:
        ``(TrainerOptimizer, {})``: keywords the caller adds to the dict
        override the factory's hyperparameters.

    Raises:
        UnknownOptimizerError: nothing provides ``name``.
        HyperparameterError: a bad hyperparameter (checked now, not at ``train()``).
    """
    if isinstance(name, OptimizerFactory):
        if impl is not None or provider is not None or registry is not None or hparams:
            raise TypeError("give either a factory or a name with its arguments, not both")
        return TrainerOptimizer(name), {}
    found = registry if registry is not None else _api.default_registry()
    return TrainerOptimizer(found.factory(name, impl=impl, provider=provider, **hparams)), {}


def from_training_args(
    args: TrainingArguments, *, registry: Registry | None = None, **overrides: Any
) -> tuple[TrainerOptimizer, dict[str, Any]]:
    """Translate ``args.optim`` and its hyperparameters to an optiplug optimizer.

    ``learning_rate``, ``weight_decay``, ``adam_beta1``/``adam_beta2`` (as
    ``betas``) and ``adam_epsilon`` (as ``eps``) are passed to the algorithm
    when it takes them (``lion`` takes no ``eps``), the last two only where
    transformers passes them for the name (not for ``adagrad``, ``rmsprop``:
    :attr:`optiplug.HFName.adam_arguments`). See :data:`HF_OPTIM_NAMES`
    for the names understood. ``optim_args`` are read for the names
    transformers reads them for and optiplug serves alike:
    ``adamw_anyprecision``, ``grokadamw`` (its five keys), and the GaLore
    and APOLLO names, which are built as transformers builds them: over
    ``optim_target_modules``, whose ``nn.Linear`` weights form a group with
    the projection keys of ``optim_args`` (``rank``, ``update_proj_gap``,
    ``scale``, ``proj_type``; APOLLO's ``proj`` and ``scale_type`` too, with
    transformers' defaults), the other parameters a plain group, and only
    ``learning_rate`` given to the constructor
    (:attr:`optiplug.HFName.target_modules`).

    Args:
        args: the Trainer's arguments.
        registry: where to look the algorithm up; the default registry when None.
        **overrides: hyperparameters replacing those read from ``args``.

    Returns:
        What ``Trainer(optimizer_cls_and_kwargs=...)`` takes.

    Raises:
        UnknownOptimizerError: ``args.optim`` has no optiplug counterpart
            (``apollo_adamw_layerwise`` without the apollo plugin...), with the
            names that do.
        HyperparameterError: ``args.optim_args`` is set for a name optiplug
            does not read them for (give the keywords as ``overrides``
            instead), holds an unknown key or asks for what optiplug cannot
            compute; ``optim_target_modules`` is missing or malformed for a
            GaLore or APOLLO name; for a layer-wise name, gradient
            accumulation, DDP, fp16, FSDP or DeepSpeed; or a bad hyperparameter.
    """
    optim = str(getattr(args.optim, "value", args.optim))
    found = registry if registry is not None else _api.default_registry()
    route = _route(optim, found)
    if route.target_modules:
        return _target_module_optimizer(optim, args, route, found, overrides)
    read, read_caveat = read_optim_args(optim, args.optim_args)
    name, impl = route.name, route.impl
    _warn_caveats(optim, args, route, read_caveat, stacklevel=3)
    offered = {
        "lr": args.learning_rate,
        "weight_decay": args.weight_decay,
        "betas": (args.adam_beta1, args.adam_beta2),
        "eps": args.adam_epsilon,
    }
    if not route.adam_arguments:  # transformers gives this name torch's own betas and eps
        offered = {key: value for key, value in offered.items() if key not in ("betas", "eps")}
    spec = found.spec(name)
    accepted = {h.name: h for h in spec.hyperparameters}
    hparams = {key: value for key, value in offered.items() if key in accepted}
    betas = accepted.get("betas")
    if betas is not None and isinstance(betas.default, tuple) and len(betas.default) != 2:
        hparams.pop("betas", None)  # AdEMAMix's three betas: the Trainer's two do not fit
    merged = {**hparams, **read, **overrides}
    made, kwargs = optimizer_cls_and_kwargs(name, impl=impl, registry=found, **merged)
    return attrs.evolve(made, decay_groups=route.decay_groups, layerwise=route.layerwise), kwargs


def _warn_caveats(
    optim: str, args: TrainingArguments, route: HFRoute, *notes: str, stacklevel: int
) -> None:
    """Warn once with how the route differs: its caveat, ``notes``, the layer-wise one."""
    steps = layerwise_caveat(args) if route.layerwise else ""
    caveat = "; ".join(note for note in (route.caveat, *notes, steps) if note)
    if caveat:
        warnings.warn(
            f"TrainingArguments.optim={optim!r}: {caveat}", UserWarning, stacklevel=stacklevel
        )


def _target_module_optimizer(
    optim: str, args: TrainingArguments, route: HFRoute, registry: Registry, overrides: Any
) -> tuple[TrainerOptimizer, dict[str, Any]]:
    """``from_training_args`` for a GaLore or APOLLO name: the groups transformers builds.

    The constructor gets ``learning_rate`` (and the keywords transformers
    fixes for the name); the target group gets the projection keys read from
    ``optim_args`` with transformers' defaults, and the Trainer's betas and
    eps where :attr:`HFRoute.adam_arguments` says so (APOLLO).
    """
    base = optim.removesuffix(_LAYERWISE) if route.layerwise else optim
    targets = target_modules(optim, args.optim_target_modules)
    group = typed_optim_args(args.optim_args or "", TARGET_GROUP_ARGS.get(base, {}))
    if route.adam_arguments:
        group.update(betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)
    _warn_caveats(optim, args, route, stacklevel=4)
    hparams = {"lr": args.learning_rate, **TARGET_KEYWORDS.get(base, {}), **overrides}
    made, kwargs = optimizer_cls_and_kwargs(
        route.name, impl=route.impl, registry=registry, **hparams
    )
    chosen = attrs.evolve(
        made, target_modules=targets, target_group=group, layerwise=route.layerwise
    )
    return chosen, kwargs
