"""optiplug's algorithms in timm's optimizer registry (``timm.optim.create_optimizer_v2``).

:func:`register` adds every algorithm of an optiplug registry to timm's
registry (timm 1.0's ``OptimizerRegistry``, by default the one
``create_optimizer_v2`` reads) as ``optiplug:<name>``::

    from optiplug_integrations import timm as optiplug_timm

    optiplug_timm.register()
    optimizer = timm.optim.create_optimizer_v2(model, "optiplug:lion", lr=1e-4, layer_decay=0.75)

Each entry's ``has_betas``, ``num_betas``, ``has_eps`` and ``has_momentum``
are read from the algorithm's hyperparameters, so timm passes ``betas``,
``eps`` and ``momentum`` only where the algorithm takes them (and, as for
its own optimizers, defaults ``momentum`` to 0.9 where it does); the names
of algorithms with a ``foreach`` kernel go to timm's foreach set
(``register_foreach_default``), and ``foreach=`` reaches them as torch's
spelling of ``impl``. timm reads an optimizer's name as the last
``_``-separated word (its ``lookahead_`` prefix), so a name with an
underscore is also registered with dashes (``optiplug:adamw-schedulefree``),
the spelling ``create_optimizer_v2`` can take.

Importing this module imports neither torch nor timm and scans no entry
points; :func:`register` does all three.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs

import optiplug as _api
from optiplug import PluginWarning, Registry
from optiplug.errors import HyperparameterError
from optiplug.validators import hyperparameters_of

__all__ = ["PREFIX", "TimmEntry", "TimmFactory", "register", "timm_entries", "timm_name"]

PREFIX = "optiplug:"
"""What every optiplug name starts with in timm's registry."""


def timm_name(name: str) -> str:
    """The name ``create_optimizer_v2`` takes for optiplug's ``name`` (``_`` read as ``-``).

    Args:
        name: an optiplug registry name (``"lion"``, ``"pytorch_optimizer:adan"``).

    Returns:
        ``"optiplug:" + name`` with each ``_`` a ``-`` (timm splits names at ``_``).
    """
    return PREFIX + name.replace("_", "-").lower()


@attrs.frozen(eq=False)
class TimmFactory:
    """What timm calls as ``opt_class(params, **opt_args)``: ``registry.create(name, ...)``.

    timm passes ``weight_decay`` always (0.0 once its param groups carry
    the decay); for an algorithm without that hyperparameter a 0.0 is
    dropped here (it asks for nothing), any other value is left for
    optiplug's validation to refuse, naming it, and a param group with a
    non-zero ``weight_decay`` is refused here (optiplug keeps a group key it
    does not know, so the decay would be silently ignored).

    Attributes:
        name: the optiplug algorithm.
        registry: the registry creating it.
        takes_weight_decay: whether the algorithm has a ``weight_decay`` hyperparameter.
    """

    name: str
    registry: Registry
    takes_weight_decay: bool

    def __call__(self, params: Any, **opt_args: Any) -> Any:
        """Build the optimizer over timm's ``params`` (param groups with ``lr_scale``, or tensors).

        Raises:
            HyperparameterError: (field ``weight_decay``) one of timm's param
                groups asks for weight decay from an algorithm without it.
        """
        params = params if hasattr(params, "named_parameters") else list(params)  # a module stays
        if not self.takes_weight_decay:
            self._refuse_group_decay(params if isinstance(params, list) else [])
            if opt_args.get("weight_decay") == 0:
                opt_args.pop("weight_decay")
        return self.registry.create(self.name, params, **opt_args)

    def _refuse_group_decay(self, params: list[Any]) -> None:
        """Refuse a group's non-zero ``weight_decay``, which the algorithm would silently ignore."""
        for group in params:
            decay = group.get("weight_decay", 0) if isinstance(group, dict) else 0
            if decay:
                reason = (
                    f"{self.name} has no weight decay, but timm's param groups ask for it; "
                    "give create_optimizer_v2 weight_decay=0"
                )
                raise HyperparameterError("weight_decay", decay, reason, algorithm=self.name)


@attrs.frozen
class TimmEntry:
    """One algorithm as timm's ``OptimInfo`` describes it.

    Attributes:
        name: the optiplug name.
        timm_names: ``optiplug:<name>``, then the dashed spelling when it differs.
        description: the spec's description.
        has_eps: whether it takes ``eps``.
        has_momentum: whether it takes ``momentum``.
        has_betas: whether it takes ``betas``.
        num_betas: how many betas (the default's length; 2 without one).
        takes_foreach: whether it has a ``foreach`` implementation.
        takes_weight_decay: whether it takes ``weight_decay``.
    """

    name: str
    timm_names: tuple[str, ...]
    description: str
    has_eps: bool
    has_momentum: bool
    has_betas: bool
    num_betas: int
    takes_foreach: bool
    takes_weight_decay: bool


def timm_entries(registry: Registry | None = None) -> list[TimmEntry]:
    """The timm entry of each algorithm of ``registry`` (default: the default registry).

    An algorithm whose hyperparameters cannot be read (its plugin's factory
    fails to import) is left out with a :class:`~optiplug.PluginWarning`;
    the others are listed.

    Args:
        registry: the optiplug registry.

    Returns:
        One entry per registry name, in the registry's order.
    """
    registry = registry if registry is not None else _api.default_registry()
    entries = []
    for name in registry.optimizers():
        try:
            entries.append(_entry(registry, name))
        except Exception as error:  # a broken plugin never breaks the others
            message = f"optiplug:{name} is not registered in timm: {type(error).__name__}: {error}"
            warnings.warn(message, PluginWarning, stacklevel=2)
    return entries


def _entry(registry: Registry, name: str) -> TimmEntry:
    spec = registry.spec(name)
    defaults = {h.name: h.default for h in hyperparameters_of(spec.config, spec.factory)}
    betas = defaults.get("betas")
    names = tuple(dict.fromkeys((PREFIX + name.lower(), timm_name(name))))
    return TimmEntry(
        name=name,
        timm_names=names,
        description=spec.description,
        has_eps="eps" in defaults,
        has_momentum="momentum" in defaults,
        has_betas="betas" in defaults,
        num_betas=len(betas) if isinstance(betas, tuple) else 2,
        takes_foreach="foreach" in {i.name for i in registry.implementations(name)},
        takes_weight_decay="weight_decay" in defaults,
    )


def register(
    registry: Registry | None = None,
    *,
    timm_registry: Any = None,
    optim_info: Callable[..., Any] | None = None,
) -> list[str]:
    """Add every algorithm of ``registry`` to timm's optimizer registry.

    Args:
        registry: the optiplug registry (default: the default registry).
        timm_registry: timm's ``OptimizerRegistry`` (default: the one
            ``timm.optim.create_optimizer_v2`` uses).
        optim_info: the record class timm registers (default:
            ``timm.optim.OptimInfo``).

    Returns:
        The timm names added (``optiplug:<name>``, and each dashed spelling).

    Raises:
        ImportError: timm is not installed (or does not import) and no
            ``timm_registry`` is given.
    """
    if timm_registry is None or optim_info is None:
        from timm.optim import OptimInfo, _optim_factory  # deferred: optional dependency

        timm_registry = _optim_factory.default_registry if timm_registry is None else timm_registry
        optim_info = OptimInfo if optim_info is None else optim_info
    registry = registry if registry is not None else _api.default_registry()
    added: list[str] = []
    for entry in timm_entries(registry):
        factory = TimmFactory(entry.name, registry, entry.takes_weight_decay)
        timm_registry.register(optim_info(entry.timm_names[0], factory, **_info_fields(entry)))
        for alias in entry.timm_names[1:]:
            timm_registry.register_alias(alias, entry.timm_names[0])
        if entry.takes_foreach:
            for timm_spelling in entry.timm_names:
                timm_registry.register_foreach_default(timm_spelling)
        added.extend(entry.timm_names)
    return added


def _info_fields(entry: TimmEntry) -> Mapping[str, Any]:
    """The keywords of timm's ``OptimInfo`` (after ``name`` and ``opt_class``) for ``entry``."""
    return {
        "description": entry.description,
        "has_eps": entry.has_eps,
        "has_momentum": entry.has_momentum,
        "has_betas": entry.has_betas,
        "num_betas": entry.num_betas,
    }
