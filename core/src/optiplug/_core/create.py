"""Creating optimizers from registry records: validation, then implementation choice."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..errors import ImplementationError, OptiplugError
from ..validators import hyperparameters_of, known_hyperparameters
from . import decision as _decision
from .binding import provided_default
from .decision import Prepared
from .groups import (
    GROUPING_KEYWORDS,
    build_groups,
    check_grouping,
    module_params,
    plan_groups,
)
from .params import parameter_tensors
from .protocols import ImplementationSelector, OptimizerCreator
from .record import OptimizerRecord, attach_record
from .specs import ImplementationSpec, OptimizerSpec
from .torch_flags import (
    KERNEL_FLAGS,
    REFUSED_FLAGS,
    all_on_cuda,
    fixed_decoupling,
    torch_flag_spellings,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "OWN_PARAM_GROUPS",
    "USES_MODEL",
    "USES_REGISTRY",
    "OptimizerFactory",
    "create_optimizer",
    "validated_hparams",
]

USES_REGISTRY = "uses-registry"
"""Capability tag: the algorithm's factory takes ``registry=`` (the creating registry).

Declared by algorithms that build other algorithms (``multi``), so those are
looked up in the registry that created them; see :func:`create_optimizer`.
"""

USES_MODEL = "uses-model"
"""Capability tag: the algorithm's factory takes ``model=`` (the module the parameters come from).

``optiplug.create(name, module)`` then passes the module as ``model=``. An
algorithm whose config (or factory signature) has a ``model`` hyperparameter
(``muon``) gets it too, without the tag.
"""

OWN_PARAM_GROUPS = "own-param-groups"
"""Capability tag: the factory takes ``no_decay=``, ``layer_decay=``, ``num_layers=`` itself.

Declared by algorithms that build their own parameter sets (``multi``, per
route) and apply :func:`optiplug.base.param_groups` to each; the others get
their ``params`` already split by :func:`create_optimizer`.
"""


def validated_hparams(
    spec: OptimizerSpec, hparams: dict[str, Any], params: Sequence[Any] = ()
) -> dict[str, Any]:
    """Merge ``spec.defaults`` under ``hparams`` and validate (groups too).

    Args:
        spec: the algorithm.
        hparams: user keywords.
        params: the materialised ``params`` argument; its param-group dicts'
            overrides are validated merged over ``hparams``.

    The grouping keywords (``no_decay``, ``layer_decay``, ``num_layers``)
    are checked here and left out of the result, as is ``model`` for an
    algorithm that does not take it (see :func:`create_optimizer`).

    Returns:
        The merged keywords to pass to the factory.

    Raises:
        HyperparameterError: naming the algorithm, field and value.
    """
    return _validated(spec, hparams, params)[0]


def _validated(
    spec: OptimizerSpec, hparams: dict[str, Any], params: Sequence[Any]
) -> tuple[dict[str, Any], Any]:
    """:func:`validated_hparams`, and the config instance (None without a config class)."""
    check_grouping(hparams, spec.name)
    hparams = {key: value for key, value in hparams.items() if key not in GROUPING_KEYWORDS}
    if not _takes_model(spec):
        hparams.pop("model", None)
    merged = {**spec.defaults, **hparams}
    config = _decision.validate(spec.name, merged, params, config=spec.config, factory=spec.factory)
    return merged, config


def _build(
    spec: OptimizerSpec,
    candidates: Sequence[ImplementationSpec],
    impl: str | None,
    made: Prepared,
    chooser: ImplementationSelector,
) -> torch.optim.Optimizer:
    """Build ``made`` with ``impl`` if forced, else with the best candidate that builds.

    Unforced, the candidates are tried best first (measured, or by priority);
    one that raises is skipped for the next, and reported (a
    :class:`~optiplug.PluginWarning`, once per process) only when a later
    one, or else the algorithm's own factory, succeeds: when every one
    fails, the own factory's error is raised and no implementation is blamed.
    """
    tensors = parameter_tensors(made.params)
    if impl is not None:
        forced = chooser.select(
            spec.name, candidates, impl, tensors, made.hparams, config=made.config
        )
        return _build_forced(forced, made)
    optimizer, failed = _first_that_builds(spec, candidates, tensors, made, chooser)
    for implementation, failure in failed:
        chooser.report_failure(implementation, failure)
    return optimizer


def _first_that_builds(
    spec: OptimizerSpec,
    candidates: Sequence[ImplementationSpec],
    tensors: Sequence[Any],
    made: Prepared,
    chooser: ImplementationSelector,
) -> tuple[torch.optim.Optimizer, list[tuple[ImplementationSpec, Exception]]]:
    """The optimizer of the best candidate that builds, and the ones that raised before it.

    Falls back to ``spec.factory`` (whose error propagates) when none builds.
    A first measurement running in the background goes with the decision
    (:attr:`Prepared.tuning`): the optimizer switches when it is done.
    """
    follow: list[Any] = []
    remaining = list(candidates)
    failed: list[tuple[ImplementationSpec, Exception]] = []
    while remaining:
        offered = _offered(spec, remaining)
        chosen = chooser.select(
            spec.name, offered, None, tensors, made.hparams, config=made.config, follow=follow
        )
        if chosen is None:  # none of those offered can run these parameters
            if len(offered) == len(remaining):
                break
            remaining = [c for c in remaining if c not in offered]
            continue
        try:
            tuning = follow[-1] if follow else None
            decision = attrs.evolve(made, implementation=chosen, tuning=tuning)
            return _decision.build(chosen.factory, decision), failed
        except Exception as error:
            failed.append((chosen, error))
            remaining = [c for c in remaining if c is not chosen]
    return _decision.build(spec.factory, made), failed


def _offered(spec: OptimizerSpec, remaining: list[ImplementationSpec]) -> list[ImplementationSpec]:
    """The candidates the chooser may pick from: all, or only the highest-priority one.

    A step that needs a closure or a kept graph cannot be timed on
    synthetic gradients, and a bridged algorithm's implementations are
    another library's, not bit-identical to each other (a measured choice
    that differs between two runs would break a bit-equal resume): such an
    algorithm takes its implementations by declared priority, one at a
    time, unmeasured.
    """
    unmeasured = spec.step_closure or spec.create_graph or spec.origin is not None
    if not unmeasured or not remaining:
        return remaining
    return [min(remaining, key=lambda c: (-c.priority, c.name))]


def _build_forced(chosen: ImplementationSpec | None, made: Prepared) -> torch.optim.Optimizer:
    """Build the forced implementation; its failure raises, typed and chained.

    Raises:
        ImplementationError: the factory raised something other than an
            :class:`~optiplug.errors.OptiplugError` (which passes through).
    """
    if chosen is None:  # select() returns the forced record or raises
        raise AssertionError("a forced implementation was not selected")
    try:
        optimizer: torch.optim.Optimizer = _decision.build(
            chosen.factory, attrs.evolve(made, implementation=chosen)
        )
    except OptiplugError:
        raise
    except Exception as error:
        origin = f" from plugin {chosen.provider}" if chosen.provider is not None else ""
        raise ImplementationError(
            f"{chosen.algorithm}: implementation {chosen.name!r}{origin} failed to build the "
            f"optimizer: {type(error).__name__}: {error}"
        ) from error
    return optimizer


def create_optimizer(
    spec: OptimizerSpec,
    candidates: Sequence[ImplementationSpec],
    params: Iterable[Any],
    *,
    registry: object,
    chooser: ImplementationSelector,
    impl: str | None = None,
    **hparams: Any,
) -> torch.optim.Optimizer:
    """Build algorithm ``spec`` over ``params`` (see :func:`optiplug.create`).

    The registry has resolved the name (``spec``) and the implementations
    (``candidates``); this validates the keywords once, builds the param
    groups once and chooses the implementation once, then hands the
    factory a :class:`~optiplug._core.decision.Prepared` (a class that takes
    one builds from it without validating or choosing again; any other
    factory is called with ``(params, **hparams)``).

    Hyperparameters are merged over ``spec.defaults`` and validated (param
    groups too), an implementation is chosen (``impl`` when forced, else the
    fastest that can run ``params``), and its factory (or the spec's, when
    no implementation can run them) is called with ``params`` and the
    keywords. An implementation that raises is skipped for the next one
    with a :class:`~optiplug.PluginWarning` unless it was forced.

    An algorithm whose :attr:`OptimizerSpec.capabilities` holds
    :data:`USES_REGISTRY` (``"uses-registry"``) also gets ``registry=``, the
    registry creating it, so an optimizer built from other algorithms (such
    as ``multi``) looks them up where it was itself found, not in the
    default registry. A ``registry`` keyword the user gave wins.

    ``params`` may be an ``nn.Module``: its ``named_parameters()`` are used,
    and it is passed as ``model=`` to an algorithm that takes one
    (:data:`USES_MODEL`). ``no_decay``/``layer_decay``/``num_layers`` split
    ``params`` into param groups (:func:`optiplug.base.param_groups`) for
    every algorithm, except one declaring :data:`OWN_PARAM_GROUPS`, which
    gets the keywords. Without them nothing changes: the default is no
    grouping, for parity with ``torch.optim`` (docs/param_groups.md).

    Args:
        spec: the algorithm, as the registry resolved it.
        candidates: its registered implementations.
        params: tensors, param-group dicts, ``(name, tensor)`` pairs, or an
            ``nn.Module``.
        registry: the registry creating the optimizer (tagged on it, and
            passed to a :data:`USES_REGISTRY` factory); never called here.
        chooser: the registry's implementation chooser (``registry.chooser``).
        impl: the implementation to force, or None to choose.
        **hparams: the algorithm's hyperparameters, plus ``model`` (the
            module, to classify parameters by module type), ``no_decay``
            (``"auto"`` or a list of name globs; default None: no
            exclusion), ``layer_decay`` (float in (0, 1]) and ``num_layers``.

    Returns:
        The optimizer, carrying its :class:`~optiplug.OptimizerRecord`.

    Raises:
        HyperparameterError: a bad keyword or value, or an ``impl`` that does
            not exist or cannot run ``params``.
        OptimizerUnavailableError: the forced ``impl`` cannot run on this
            machine (its availability check's reason is in the message).
        ImplementationError: the forced ``impl`` failed to build (chained).
    """
    params, model = module_params(params, hparams.get("model"))
    impl, hparams = _spelled(spec, candidates, impl, hparams, params)
    grouping = {key: hparams[key] for key in GROUPING_KEYWORDS if hparams.get(key) is not None}
    merged, config = _validated(spec, hparams, params)
    if model is not None and _takes_model(spec):
        merged["model"] = model
    reasons: dict[str, str] = {}
    if OWN_PARAM_GROUPS in spec.capabilities:
        merged.update(grouping)
    elif grouping.keys() - {"num_layers"}:
        # The groups only scale a valid lr and zero weight decay: nothing to validate again.
        params, reasons = _grouped(spec, params, model, grouping, merged)
    if USES_REGISTRY in spec.capabilities:
        merged.setdefault("registry", registry)
    made = Prepared(spec.name, params, merged, config, chooser=chooser)
    optimizer = _build(spec, candidates, impl, made, chooser)
    chosen = getattr(optimizer, "impl", None)
    implementation = chosen if isinstance(chosen, str) else None
    attach_record(optimizer, OptimizerRecord(spec, registry, implementation, reasons))
    return optimizer


def _spelled(
    spec: OptimizerSpec,
    candidates: Sequence[ImplementationSpec],
    impl: str | None,
    hparams: dict[str, Any],
    params: Sequence[Any],
) -> tuple[str | None, dict[str, Any]]:
    """``impl`` and the keywords with torch's ``fused=``/``foreach=`` read as ``impl``."""
    flags = (*KERNEL_FLAGS, *REFUSED_FLAGS, "decoupled_weight_decay")
    if not any(flag in hparams for flag in flags):
        return impl, hparams
    known = known_hyperparameters(spec.config, spec.factory)
    names = [candidate.name for candidate in candidates]
    on_cuda = all_on_cuda(parameter_tensors(params))
    decoupled = fixed_decoupling(spec.factory) if "decoupled_weight_decay" in hparams else None
    return torch_flag_spellings(spec.name, names, known, impl, hparams, on_cuda, decoupled)


def _takes_model(spec: OptimizerSpec) -> bool:
    """Whether ``spec``'s factory takes ``model=`` (:data:`USES_MODEL`, or a ``model`` keyword)."""
    if USES_MODEL in spec.capabilities:
        return True
    try:
        names = {h.name for h in hyperparameters_of(spec.config, spec.factory)}
    except Exception:  # a factory that cannot be inspected (or imported) takes no model
        return False
    return "model" in names


def _numeric(values: dict[str, Any], key: str) -> bool:
    """Whether ``values[key]`` is a number or a tensor, or is missing (``adjust_lr`` is neither)."""
    value = values.get(key)
    if value is None:
        return key in {"lr", "weight_decay"}
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or hasattr(
        value, "dim"
    )


def _grouped(
    spec: OptimizerSpec,
    params: list[Any],
    model: Any,
    grouping: dict[str, Any],
    merged: dict[str, Any],
) -> tuple[list[Any], dict[str, str]]:
    """``params`` split into param groups by ``no_decay``/``layer_decay``, and each parameter's reason.

    The learning-rate keys scaled are ``lr`` and every hyperparameter ending
    in ``_lr`` (muon's ``aux_lr``); the weight-decay keys zeroed are
    ``weight_decay`` and every one ending in ``_weight_decay``.
    """
    known = {h.name: h.default for h in hyperparameters_of(spec.config, spec.factory)}
    base = {**known, **merged}
    names = set(base) | {"lr", "weight_decay"}
    lr_keys = sorted(n for n in names if (n == "lr" or n.endswith("_lr")) and _numeric(base, n))
    decay_keys = sorted(
        n
        for n in names
        if (n == "weight_decay" or n.endswith("_weight_decay")) and _numeric(base, n)
    )
    plans, options, named = plan_groups(
        params,
        model=model,
        no_decay=grouping.get("no_decay"),
        layer_decay=grouping.get("layer_decay"),
        num_layers=grouping.get("num_layers"),
        algorithm=spec.name,
    )
    groups = build_groups(
        plans,
        options,
        named,
        hparams=base,
        lr_keys=lr_keys,
        weight_decay_keys=decay_keys,
        algorithm=spec.name,
    )
    reasons = {
        plan.name if plan.name is not None else f"#{index}": plan.reason
        for index, plan in enumerate(plans)
    }
    return groups, reasons


@attrs.frozen
class OptimizerFactory:
    """A picklable recipe for an optimizer: call it with parameters.

    Built by :func:`optiplug.factory` or :meth:`optiplug.Registry.factory`;
    it resolves ``name`` in the registry that built it. The registry is not
    pickled: an unpickled factory resolves names in the default registry of
    the process that calls it.

    Attributes:
        name: algorithm name.
        hparams: hyperparameters (already validated).
        impl: forced implementation, or None to choose by measurement.
        provider: plugin or distribution that must provide ``name``, or None.
        registry: the :class:`~optiplug.Registry` that built it, or None.
    """

    name: str
    hparams: dict[str, Any] = attrs.field(factory=dict, converter=dict)
    impl: str | None = None
    provider: str | None = None
    registry: OptimizerCreator | None = attrs.field(
        default=None, eq=False, repr=False, kw_only=True
    )

    def __call__(self, params: Iterable[Any]) -> torch.optim.Optimizer:
        """Create the optimizer over ``params``.

        Args:
            params: tensors, param-group dicts or ``(name, tensor)`` pairs.

        Returns:
            A ``torch.optim.Optimizer``.
        """
        registry = self.registry if self.registry is not None else provided_default()
        return registry.create(
            self.name, params, impl=self.impl, provider=self.provider, **self.hparams
        )

    def __getstate__(self) -> dict[str, Any]:
        """Pickle every field but the registry (a process-local object)."""
        state = {field.name: getattr(self, field.name) for field in attrs.fields(type(self))}
        state["registry"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for field in attrs.fields(type(self)):  # a field added since the pickle: its default
            if field.name not in state and field.default is not attrs.NOTHING:
                default = field.default
                if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                    default = default.factory()
                object.__setattr__(self, field.name, default)
        for name, value in state.items():
            object.__setattr__(self, name, value)
