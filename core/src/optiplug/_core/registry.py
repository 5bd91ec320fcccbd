"""The registry: a typed facade over a pluggy ``PluginManager``.

Plugins are found through the ``optiplug.plugins`` entry-point group on first
need (never at import), registered with pluggy, and asked once for their
records. A plugin that fails is recorded with its error and a warning; the
others keep working. Lookups resolve aliases, detect conflicts between
plugins, and explain missing names.
"""

from __future__ import annotations

import importlib.metadata
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

from ..errors import (
    OptimizerUnavailableError,
    PluginConflictError,
    PluginError,
    PluginWarning,
    UnknownOptimizerError,
    UnknownScheduleError,
)
from . import builtin as _builtin
from .binding import new_chooser, provided_default
from .build import build_schedule
from .catalog import Catalog, Contributions
from .create import OptimizerFactory, create_optimizer, validated_hparams
from .discovery import ENTRY_POINT_GROUP, distribution_entry_points, entry_points
from .env import env_flag
from .hookcalls import failure_text, outcomes_of, typed_records
from .hooks import PROJECT_NAME, HookSpecs
from .loading import check_api, env_list, interrupted, not_loaded, plugin_records
from .naming import (
    QUALIFIER,
    Named,
    loosely_named,
    native_or_conflict,
    provider_names,
    provides,
    qualified_name,
    split_qualified,
)
from .selection import Selection, select
from .specs import (
    Candidate,
    CommandSpec,
    ImplementationSpec,
    OptimizerSpec,
    PluginInfo,
    Problem,
    ProviderInfo,
    ScheduleSpec,
    SelectionRequest,
)

if TYPE_CHECKING:
    import torch

    from .protocols import ImplementationSelector

__all__ = [
    "ENTRY_POINT_GROUP",
    "QUALIFIER",
    "PluginWarning",
    "Registry",
    "bound_registry",
    "qualified_name",
    "split_qualified",
]


class Registry:
    """Optimizers, implementations and schedules provided by plugins.

    The module-level functions (``optiplug.create`` ...) use a default
    registry built on first need; tests build their own.

    Args:
        autoload: discover installed plugins through entry points on first
            need. ``False`` gives a registry holding only the core's built-in
            schedules and selection rules plus what you :meth:`register`
            (the command line adds the built-in commands with
            :meth:`load_distribution`).
        strict: raise :class:`~optiplug.errors.PluginError` when a plugin
            fails or is incompatible. Defaults to ``OPTIPLUG_STRICT_PLUGINS``.
        disabled: plugin names not to load. Defaults to
            ``OPTIPLUG_DISABLE_PLUGINS`` (comma-separated).
        chooser: the implementation chooser this registry owns (see
            :attr:`chooser`); None makes a new one on first need.
    """

    def __init__(
        self,
        autoload: bool = True,
        *,
        strict: bool | None = None,
        disabled: Iterable[str] | None = None,
        chooser: ImplementationSelector | None = None,
    ) -> None:
        self._chooser = chooser
        self.strict = (
            env_flag("OPTIPLUG_STRICT_PLUGINS", default=False) if strict is None else strict
        )
        self.disabled = (
            env_list("OPTIPLUG_DISABLE_PLUGINS") if disabled is None else frozenset(disabled)
        )
        self._manager = pluggy.PluginManager(PROJECT_NAME)
        self._manager.add_hookspecs(HookSpecs)
        self._plain: dict[str, pluggy.PluginManager] = {}  # see plugin_managers
        self._wrapping: dict[str, pluggy.PluginManager] = {}
        self._lock = threading.RLock()
        self._pending_discovery = autoload
        self._seen_entry_points: set[tuple[str, str, str]] = set()
        self._plugins: dict[str, PluginInfo] = {}
        self._errors: dict[str, BaseException] = {}
        self._catalog = Catalog()
        for name, module in _builtin.builtin_plugins():
            self.register(
                module, name, distribution=_builtin.DISTRIBUTION, version=_builtin.version()
            )

    # ----------------------------------------------------------------- loading
    def register(
        self, plugin: object, name: str | None = None, *, distribution: str = "", version: str = ""
    ) -> PluginInfo:
        """Register a plugin object (usually a module of hookimpls).

        Args:
            plugin: the module or object carrying ``@optiplug.hookimpl`` functions.
            name: the plugin's short name; defaults to the module's name.
            distribution: the distribution that ships it, for reports.
            version: that distribution's version.

        Returns:
            The plugin's :class:`PluginInfo` (check ``status``).

        Raises:
            PluginError: in strict mode, when the plugin fails or is incompatible.
        """
        default_name: str = getattr(plugin, "__name__", type(plugin).__name__)
        plugin_name = name or default_name
        module = getattr(plugin, "__name__", "")
        info = self._load(plugin_name, lambda: plugin, distribution or "-", version or "-", module)
        self._raise_if_strict([info.name])
        return info

    def _load(
        self, name: str, load: Callable[[], object], distribution: str, version: str, module: str
    ) -> PluginInfo:
        with self._lock:
            base = PluginInfo(name, distribution, version, "active", module=module)
            if name in self.disabled:
                why = "disabled by OPTIPLUG_DISABLE_PLUGINS"
                return self._record(attrs.evolve(base, status="disabled", error=why))
            try:
                plugin = load()
                check_api(plugin)
                contributions = self._collect(
                    name, plugin, ProviderInfo(name, distribution, version)
                )
            except BaseException as error:  # a plugin may even sys.exit(); see not_loaded
                info = self._record(not_loaded(base, error), error)
                if isinstance(error, KeyboardInterrupt):
                    raise interrupted(base) from error
                return info
            self._catalog.commit(contributions)
            rule = ("rule:" + name,) if self._implements(name, "optiplug_select_optimizer") else ()
            return self._record(attrs.evolve(base, provides=contributions.names() + rule))

    def _record(self, info: PluginInfo, error: BaseException | None = None) -> PluginInfo:
        self._plugins[info.name] = info
        if error is not None:
            self._errors[info.name] = error
        return info

    def _collect(self, name: str, plugin: object, provider: ProviderInfo) -> Contributions:
        """Ask ``plugin`` alone (its own wrappers included) for its records, then register it."""
        if self._manager.get_plugin(name) is not None:
            raise ValueError(f"a plugin named {name!r} is already registered")
        contributions, plain, wrapping = plugin_records(plugin, name, provider)
        self._manager.register(plugin, name=name)
        self._plain[name] = plain
        if wrapping is not None:
            self._wrapping[name] = wrapping
        return contributions

    def _implements(self, plugin_name: str, hook_name: str) -> bool:
        hook = getattr(self._manager.hook, hook_name)
        return any(impl.plugin_name == plugin_name for impl in hook.get_hookimpls())

    def _discover(self) -> None:
        """Load every entry point of the group once (de-duplicated), then apply strictness.

        In strict mode every call raises while any plugin is failed or
        incompatible, not only the call that loaded it. An interrupted
        discovery (``KeyboardInterrupt``) resumes where it stopped.
        """
        with self._lock:
            if self._pending_discovery:
                for entry_point in entry_points():
                    self._load_entry_point(entry_point)
                self._pending_discovery = False
            self._raise_if_strict(self._plugins)

    def load_distribution(self, name: str) -> list[PluginInfo]:
        """Load the plugins one installed distribution declares, even without autoload.

        The command line loads the core's own (``optiplug``: its commands)
        this way into whatever registry it is given. An entry point already
        loaded is not loaded again, here or by a later discovery.

        Args:
            name: the distribution's name.

        Returns:
            The :class:`PluginInfo` of each of its plugins, sorted by name;
            empty when it is not installed or declares none.

        Raises:
            PluginError: in strict mode, when one of them fails or is incompatible.
        """
        with self._lock:
            for entry_point in distribution_entry_points(name):
                self._load_entry_point(entry_point)
            loaded = [i for i in self._plugins.values() if i.distribution == name]
            self._raise_if_strict(info.name for info in loaded)
            return sorted(loaded, key=lambda info: info.name)

    def _load_entry_point(self, entry_point: importlib.metadata.EntryPoint) -> None:
        """Load one entry point unless an earlier (interrupted) discovery did."""
        dist = entry_point.dist
        distribution = dist.name if dist is not None else "-"
        key = (entry_point.name, entry_point.value, distribution)
        if key in self._seen_entry_points:
            return
        self._seen_entry_points.add(key)
        version = dist.version if dist is not None else "-"
        name = entry_point.name
        if name in self._plugins:
            name = f"{name}[{distribution}]"
        self._load(name, entry_point.load, distribution, version, entry_point.value)

    def _raise_if_strict(self, names: Iterable[str]) -> None:
        if not self.strict:
            return
        bad = [
            self._plugins[n] for n in names if self._plugins[n].status in ("failed", "incompatible")
        ]
        if bad:
            described = "; ".join(
                f"{p.name} ({p.distribution} {p.version}): {p.error}" for p in bad
            )
            raise PluginError(
                f"OPTIPLUG_STRICT_PLUGINS is set and {len(bad)} plugin(s) did not load: {described}"
            ) from self._errors.get(bad[0].name)

    # ----------------------------------------------------------------- creating
    def create(
        self,
        name: str,
        params: Iterable[Any],
        *,
        impl: str | None = None,
        provider: str | None = None,
        **hparams: Any,
    ) -> torch.optim.Optimizer:
        """Create optimizer ``name`` over ``params``; see :func:`optiplug.create`.

        The name is resolved once, here; creation gets the records, not the registry to ask.
        """
        found = self.spec(name, provider=provider)
        candidates = self._catalog.implementations_of(found)
        return create_optimizer(
            found, candidates, params, registry=self, chooser=self.chooser, impl=impl, **hparams
        )

    @property
    def chooser(self) -> ImplementationSelector:
        """This registry's implementation chooser: what ``impl=None`` measured, and why.

        Made on first use (it imports torch); every choice, measurement,
        exclusion and failure it records belongs to this registry.
        """
        with self._lock:
            if self._chooser is None:
                self._chooser = new_chooser()
            return self._chooser

    def factory(
        self, name: str, *, impl: str | None = None, provider: str | None = None, **hparams: Any
    ) -> OptimizerFactory:
        """Return a picklable recipe ``params -> optimizer`` bound to this registry.

        The name and hyperparameters are checked now; see :func:`optiplug.factory`.

        Raises:
            UnknownOptimizerError: no plugin provides ``name`` (with a suggestion).
            OptimizerUnavailableError: its plugin failed, is disabled or unavailable.
            PluginConflictError: several plugins provide ``name`` and no ``provider``.
            HyperparameterError: an unknown or invalid hyperparameter.
        """
        found = self.spec(name, provider=provider)
        validated_hparams(found, hparams)
        return OptimizerFactory(
            self.name_of(found), hparams, impl=impl, provider=provider, registry=self
        )

    def schedule(self, name: str, *, provider: str | None = None, **kwargs: Any) -> Any:
        """Build schedule ``name`` from this registry; see :func:`optiplug.schedule`.

        A parameter given as a list of dicts (``sequence``'s ``schedules``)
        has each dict built by name here too.

        Raises:
            UnknownScheduleError: nothing provides ``name``.
            HyperparameterError: an unknown, missing or invalid parameter.
        """
        built = {key: self._nested_schedules(value) for key, value in kwargs.items()}
        return build_schedule(self.schedule_spec(name, provider=provider), built)

    def _nested_schedules(self, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or not any(isinstance(v, Mapping) for v in value):
            return value
        return tuple(self.schedule(**item) if isinstance(item, Mapping) else item for item in value)

    def select(self, request: SelectionRequest) -> Selection:
        """Ask every plugin's selection rule about ``request`` and rank the answers.

        Args:
            request: what is known about the task and model.

        Returns:
            The winning :class:`~optiplug.Selection`, bound to this registry.

        Raises:
            OptiplugError: no rule proposed an installed algorithm.
        """
        return select(self, request)

    # ----------------------------------------------------------------- queries
    def plugins(self) -> list[PluginInfo]:
        """Every plugin seen, sorted by name, with status and what it provides."""
        self._discover()
        return sorted(self._plugins.values(), key=lambda info: info.name)

    def optimizers(self) -> list[str]:
        """The name of every available algorithm, sorted (aliases not listed).

        Each is the name that reaches it (:meth:`name_of`): the plain name,
        or ``plugin:name`` for an algorithm whose plain name another
        provider holds or shares, so every name listed resolves.
        """
        self._discover()
        return sorted(
            self.name_of(spec) for specs in self._catalog.optimizers.values() for spec in specs
        )

    def schedules(self) -> list[str]:
        """Names of every available schedule, sorted (aliases not listed)."""
        self._discover()
        return sorted(self._catalog.schedules)

    def optimizer_specs(self) -> list[OptimizerSpec]:
        """Every registered optimizer spec (all providers of a contested name), sorted."""
        self._discover()
        return [
            spec
            for name in sorted(self._catalog.optimizers)
            for spec in self._catalog.optimizers[name]
        ]

    def schedule_specs(self) -> list[ScheduleSpec]:
        """Every registered schedule spec (all providers of a contested name), sorted."""
        self._discover()
        return [
            spec
            for name in sorted(self._catalog.schedules)
            for spec in self._catalog.schedules[name]
        ]

    def command_specs(self) -> list[CommandSpec]:
        """Every ``optiplug`` subcommand plugins provide, sorted by name (first provider wins)."""
        self._discover()
        return [self._catalog.commands[name][0] for name in sorted(self._catalog.commands)]

    def spec(self, name: str, *, provider: str | None = None) -> OptimizerSpec:
        """Return the spec of algorithm ``name`` (an alias resolves).

        Args:
            name: algorithm name or alias.
            provider: plugin or distribution name, to pick among conflicting providers.

        Returns:
            The :class:`OptimizerSpec`, with ``provider`` filled in.

        Raises:
            UnknownOptimizerError: nothing provides ``name``.
            OptimizerUnavailableError: the plugin that would provide it failed,
                is disabled, incompatible or unavailable here.
            PluginConflictError: several plugins provide it and ``provider`` is None.
        """
        self._discover()
        return self._resolve(self._catalog.optimizers, name, provider, UnknownOptimizerError)

    def has(self, name: str, *, provider: str | None = None) -> bool:
        """Whether :meth:`spec` finds algorithm ``name`` (a contested name counts: it exists).

        Args:
            name: a plain or qualified name, or an alias.
            provider: plugin or distribution name, as for :meth:`spec`.

        Returns:
            False when nothing active provides it.
        """
        try:
            self.spec(name, provider=provider)
        except PluginConflictError:
            return True
        except (UnknownOptimizerError, OptimizerUnavailableError):
            return False
        return True

    def schedule_spec(self, name: str, *, provider: str | None = None) -> ScheduleSpec:
        """Return the spec of schedule ``name``; raises like :meth:`spec`."""
        self._discover()
        return self._resolve(self._catalog.schedules, name, provider, UnknownScheduleError)

    def implementations(
        self, name: str, *, provider: str | None = None
    ) -> list[ImplementationSpec]:
        """Every registered implementation of algorithm ``name``, sorted by name."""
        return self._catalog.implementations_of(self.spec(name, provider=provider))

    def implementation_failures(self, name: str, *, provider: str | None = None) -> dict[str, str]:
        """Implementations of algorithm ``name`` this process skipped because they failed.

        An implementation that raises while being timed or built for an
        unforced choice is skipped with a :class:`PluginWarning`;
        ``optiplug show NAME`` lists it as failed.

        Args:
            name: algorithm name or alias.
            provider: plugin or distribution name, as for :meth:`spec`.

        Returns:
            ``{implementation name: "TypeName: message"}``, sorted by name.
        """
        mine = {_implementation_key(i) for i in self.implementations(name, provider=provider)}
        failed = self.chooser.implementation_failures()
        return {key[1]: failed[key] for key in sorted(mine & failed.keys())}

    def _resolve(
        self,
        table: Mapping[str, list[Named]],
        name: str,
        provider: str | None,
        unknown: type[UnknownOptimizerError],
    ) -> Named:
        qualifier, name = split_qualified(name)
        entries = list(table.get(name, ()))
        if not entries:
            entries = [rec for recs in table.values() for rec in recs if name in rec.aliases]
        if not entries:
            entries = loosely_named(table, name)
        for wanted in (provider, qualifier):
            if wanted is not None:
                entries = [rec for rec in entries if wanted in provider_names(rec)]
        if not entries:
            raise self._missing(name, sorted(table), unknown, provider or qualifier)
        if len(entries) > 1:
            return native_or_conflict(name, entries)
        return entries[0]

    def name_of(self, spec: OptimizerSpec) -> str:
        """The name that reaches ``spec``: its plain name where that resolves to it, else ``plugin:name``.

        Args:
            spec: one of this registry's optimizer specs.

        Returns:
            E.g. ``"adamw"`` for the native AdamW, ``"pytorch_optimizer:adamw"``
            for the bridged one.
        """
        return self._catalog.name_of(spec)

    def clashes(self) -> dict[str, tuple[str, ...]]:
        """Optimizer names more than one plugin provides, and how to reach each.

        A clash is never resolved silently by load order: the plain name
        goes to the one native algorithm among the providers (one with no
        :attr:`~optiplug.OptimizerSpec.origin`, i.e. not bridged from
        another library), and otherwise to none of them; every provider's
        algorithm stays reachable by its qualified name.

        Returns:
            ``{name: (qualified names of every provider, sorted)}``.
        """
        self._discover()
        return self._catalog.clashes()

    def _missing(
        self,
        name: str,
        available: Sequence[str],
        unknown: type[UnknownOptimizerError],
        provider: str | None,
    ) -> Exception:
        for info in self._plugins.values():
            if info.status != "active" and (name == info.name or provides(info, name)):
                error = OptimizerUnavailableError(
                    f"{name!r} is provided by plugin {info.name!r} ({info.distribution} "
                    f"{info.version}), which is {info.status}: {info.error}"
                )
                error.__cause__ = self._errors.get(info.name)
                return error
        notes = []
        if provider is not None:
            notes.append(f"(No provider {provider!r} offers {name!r}.)")
        broken = [p.name for p in self._plugins.values() if p.status in ("failed", "incompatible")]
        if broken:
            notes.append(
                f"(Plugins that did not load: {', '.join(sorted(broken))}; see `optiplug list`.)"
            )
        return unknown(name, available, notes)

    # --------------------------------------------------------------- hook calls
    def call_each(
        self, hook_name: str, **kwargs: Any
    ) -> Iterator[tuple[PluginInfo, Any, BaseException | None]]:
        """Call ``hook_name`` through pluggy and report each plugin's answer separately.

        The hook is called in pluggy's order: ``tryfirst`` and ``trylast``
        order the implementations (otherwise the last registered is called
        first) and wrappers wrap the call and may change its results. Each
        plugin is called in a pluggy manager of its own, so one whose
        implementation raises (``SystemExit`` included) is reported with its
        exception and does not stop the others; so is a wrapper that raises.
        A ``KeyboardInterrupt`` propagates, its message naming the plugin.

        Args:
            hook_name: ``optiplug_select_optimizer`` or ``optiplug_validate_state_dict``.
            **kwargs: the hook's arguments.

        Yields:
            ``(plugin info, result, None)`` per answer, in the order the
            outermost wrapper returned them (pluggy's call order unless a
            wrapper reorders; an answer a wrapper added or replaced is its
            plugin's), then ``(plugin info, None, exception)`` per failure.

        Raises:
            PluginError: in strict mode, while any plugin is failed or incompatible.
        """
        self._discover()
        hook = getattr(self._manager.hook, hook_name)
        for plugin_name, result, failure in outcomes_of(hook, self._plain, self._wrapping, kwargs):
            yield self._plugins[plugin_name], result, failure

    def candidates(self, request: SelectionRequest) -> list[tuple[Candidate, PluginInfo]]:
        """Collect every plugin's candidates for ``request`` (broken rules skipped).

        A rule that raises or returns anything but an iterable of
        :class:`~optiplug.Candidate` (None counts as no candidates) marks its
        plugin ``failed`` with a :class:`PluginWarning`; the others decide.

        Args:
            request: the selection request.

        Returns:
            ``(candidate with provider filled in, plugin)`` pairs, in call order.

        Raises:
            PluginError: in strict mode, when a rule fails.
        """
        found = []
        for info, result, error in self.call_each("optiplug_select_optimizer", request=request):
            if info.status != "active":
                continue  # its rule failed before
            proposed = typed_records(result, Candidate) if error is None else error
            if isinstance(proposed, BaseException):
                self._rule_failed(info, proposed)
                continue
            provider = ProviderInfo(info.name, info.distribution, info.version)
            found += [(attrs.evolve(c, provider=provider), info) for c in proposed]
        return found

    def _rule_failed(self, info: PluginInfo, error: BaseException) -> None:
        """Mark ``info``'s plugin failed because its selection rule did; warn or raise."""
        text = f"selection rule failed: {failure_text(error, 'selecting')}"
        with self._lock:
            self._record(attrs.evolve(info, status="failed", error=text), error)
        warnings.warn(
            f"optiplug plugin {info.name!r} ({info.distribution} {info.version}): {text}; "
            "its candidates are skipped, the other rules decide",
            PluginWarning,
            stacklevel=4,
        )
        self._raise_if_strict([info.name])

    def extra_state_problems(
        self, spec: OptimizerSpec, optimizer: Any, state_dict: Any
    ) -> list[Problem]:
        """Collect every plugin's extra state-dict problems.

        A validation hook that raises, or returns anything but an iterable of
        :class:`~optiplug.Problem` (None counts as none), is itself reported as
        one ``validator-error`` problem naming the plugin, so a broken plugin
        cannot let an unchecked state dict through.
        """
        problems: list[Problem] = []
        calls = self.call_each(
            "optiplug_validate_state_dict", spec=spec, optimizer=optimizer, state_dict=state_dict
        )
        for info, result, error in calls:
            found = typed_records(result, Problem) if error is None else error
            if isinstance(found, BaseException):
                expected = "an iterable of optiplug.Problem, and no error"
                text = failure_text(found, "validating")
                problems.append(
                    Problem(kind="validator-error", slot=info.name, expected=expected, found=text)
                )
            else:
                problems.extend(found)
        return problems


def bound_registry(registry: Registry | None) -> Registry:
    """Return ``registry``, or the default registry the facade provides when it is None.

    Args:
        registry: the registry an object carries, or None.

    Returns:
        A :class:`Registry`.

    Raises:
        RuntimeError: None was given and ``optiplug`` was not imported.
    """
    if registry is not None:
        return registry
    default = provided_default()
    if not isinstance(default, Registry):
        raise TypeError(f"the default registry is a {type(default).__name__}, not a Registry")
    return default


def _implementation_key(impl: ImplementationSpec) -> tuple[str, str, str]:
    """``(algorithm, name, plugin)``, as the chooser's ``implementation_failures`` keys it."""
    return (impl.algorithm, impl.name, impl.provider.plugin if impl.provider else "")
