"""The records a registry's plugins provided, by name, and which algorithm each implementation binds to.

A :class:`Catalog` only keeps and answers; the :class:`~optiplug.Registry`
loads plugins into it (:meth:`Catalog.commit`, once all of a plugin's hooks
succeeded) and resolves names against its tables.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ..errors import PluginConflictError
from .naming import QUALIFIER, native_or_conflict, provider_names, qualified_name, split_qualified
from .specs import CommandSpec, ImplementationSpec, OptimizerSpec, ScheduleSpec

__all__ = ["Catalog", "Contributions"]


@attrs.define
class Contributions:
    """Records one plugin returned, committed only if all hooks succeeded."""

    optimizers: list[OptimizerSpec] = attrs.Factory(list)
    implementations: list[ImplementationSpec] = attrs.Factory(list)
    schedules: list[ScheduleSpec] = attrs.Factory(list)
    commands: list[CommandSpec] = attrs.Factory(list)

    def names(self) -> tuple[str, ...]:
        provided = [f"optimizer:{s.name}" for s in self.optimizers]
        inline = [impl for spec in self.optimizers for impl in spec.implementations]
        provided += [
            f"implementation:{i.algorithm}/{i.name}" for i in inline + self.implementations
        ]
        provided += [f"schedule:{s.name}" for s in self.schedules]
        provided += [f"command:{c.name}" for c in self.commands]
        return tuple(provided)


@attrs.define
class Catalog:
    """Every provider's records of each name, in the order the plugins loaded.

    Attributes:
        optimizers: algorithm name -> the specs of every provider.
        implementations: the plain name of an algorithm -> implementation records.
        schedules: schedule name -> the specs of every provider.
        commands: subcommand name -> the specs of every provider.
    """

    optimizers: dict[str, list[OptimizerSpec]] = attrs.Factory(dict)
    implementations: dict[str, list[ImplementationSpec]] = attrs.Factory(dict)
    schedules: dict[str, list[ScheduleSpec]] = attrs.Factory(dict)
    commands: dict[str, list[CommandSpec]] = attrs.Factory(dict)

    def commit(self, contributions: Contributions) -> None:
        """Add one plugin's records (an optimizer's inline implementations get its provider)."""
        for spec in contributions.optimizers:
            self.optimizers.setdefault(spec.name, []).append(spec)
            self._add_implementations(
                attrs.evolve(impl, provider=impl.provider or spec.provider)
                for impl in spec.implementations
            )
        self._add_implementations(contributions.implementations)
        for schedule in contributions.schedules:
            self.schedules.setdefault(schedule.name, []).append(schedule)
        for command in contributions.commands:
            self.commands.setdefault(command.name, []).append(command)

    def _add_implementations(self, records: Iterable[ImplementationSpec]) -> None:
        for record in records:
            name = split_qualified(record.algorithm)[1]
            self.implementations.setdefault(name, []).append(record)

    def implementations_of(self, spec: OptimizerSpec) -> list[ImplementationSpec]:
        """Every registered implementation of the resolved ``spec``, sorted by name."""
        named = self.implementations.get(spec.name, ())
        found = [impl for impl in named if self._binds(impl, spec)]
        return sorted(
            found, key=lambda impl: (impl.name, impl.provider.plugin if impl.provider else "")
        )

    def _binds(self, impl: ImplementationSpec, spec: OptimizerSpec) -> bool:
        """Whether implementation ``impl`` is one of algorithm ``spec``'s.

        Its ``algorithm`` names the algorithm: qualified (``plugin:name``), that
        provider's; plain, its own plugin's algorithm of that name when the
        plugin has one (a bridge's implementations of its own ``muon``), else
        the algorithm the plain name resolves to (a kernel plugin's
        implementation of the native ``adamw``).
        """
        if impl.algorithm != spec.name and QUALIFIER not in impl.algorithm:
            return False  # another algorithm's (the common case: no parsing)
        qualifier, name = split_qualified(impl.algorithm)
        if name != spec.name:
            return False
        owner = spec.provider.plugin if spec.provider is not None else None
        if qualifier is not None:
            return qualifier in provider_names(spec)
        own = impl.provider.plugin if impl.provider is not None else None
        if own is not None and any(
            provider_names(other) & {own} for other in self.optimizers.get(name, ())
        ):
            return own == owner
        if len(self.optimizers.get(name, ())) < 2:
            return True
        try:
            return native_or_conflict(name, self.optimizers[name]) is spec
        except PluginConflictError:
            return False

    def name_of(self, spec: OptimizerSpec) -> str:
        """The name that reaches ``spec``: its plain name where that resolves to it, else ``plugin:name``."""
        specs = self.optimizers.get(spec.name, ())
        if len(specs) < 2:
            return spec.name
        try:
            winner = native_or_conflict(spec.name, specs)
        except PluginConflictError:
            return qualified_name(spec)
        return spec.name if winner == spec else qualified_name(spec)

    def clashes(self) -> dict[str, tuple[str, ...]]:
        """``{name: (qualified names of every provider, sorted)}`` for each contested name."""
        return {
            name: tuple(sorted(qualified_name(spec) for spec in specs))
            for name, specs in sorted(self.optimizers.items())
            if len(specs) > 1
        }
