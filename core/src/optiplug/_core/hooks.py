"""Hook specifications: the whole surface a plugin can implement.

A plugin is a module (named by an entry point in the ``optiplug.plugins``
group) whose functions are marked with :data:`hookimpl`. Registration hooks
*return* records; nothing registers by side effect. Every hook is optional.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .specs import (
        Candidate,
        CommandSpec,
        ImplementationSpec,
        OptimizerSpec,
        Problem,
        ScheduleSpec,
        SelectionRequest,
    )

__all__ = ["HOOK_NAMES", "PLUGIN_API_VERSION", "PROJECT_NAME", "HookSpecs", "hookimpl", "hookspec"]

PROJECT_NAME = "optiplug"
PLUGIN_API_VERSION = 1
"""The plugin API major version this core speaks (a plugin's ``OPTIPLUG_API``)."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class HookSpecs:
    """The hooks optiplug calls. Each is answered by every plugin.

    pluggy reads only the signatures and docstrings here; the bodies, never
    called, return the empty answer of a plugin that leaves a hook out.
    """

    @hookspec
    def optiplug_optimizers(self) -> Iterable[OptimizerSpec]:
        """Return the optimizer algorithms this plugin provides.

        Returns:
            Iterable of :class:`optiplug.OptimizerSpec`; names must be unique
            within the plugin. A name another plugin also provides is a
            conflict the user resolves with ``provider=``.
        """
        return ()

    @hookspec
    def optiplug_implementations(self) -> Iterable[ImplementationSpec]:
        """Return extra implementations of algorithms (possibly another plugin's).

        Returns:
            Iterable of :class:`optiplug.ImplementationSpec`. An implementation
            must keep the algorithm's state layout so checkpoints move freely
            between implementations.
        """
        return ()

    @hookspec
    def optiplug_schedules(self) -> Iterable[ScheduleSpec]:
        """Return the learning-rate schedules this plugin provides.

        Returns:
            Iterable of :class:`optiplug.ScheduleSpec`.
        """
        return ()

    @hookspec
    def optiplug_select_optimizer(self, request: SelectionRequest) -> Iterable[Candidate]:
        """Propose optimizers for a task or model (``AutoOptimizer``).

        Args:
            request: what is known about the task, model and training stage.

        Returns:
            Iterable of scored :class:`optiplug.Candidate`; may be empty. All
            plugins answer; the highest score wins and ties are broken by
            algorithm name, then plugin name (never install order).
        """
        return ()

    @hookspec
    def optiplug_validate_state_dict(
        self, spec: OptimizerSpec, optimizer: Any, state_dict: Mapping[str, Any]
    ) -> Iterable[Problem]:
        """Return extra problems found in a state dict about to be loaded.

        Args:
            spec: the spec of the algorithm of ``optimizer``.
            optimizer: the optimizer the state dict would be loaded into.
            state_dict: the candidate state dict (do not modify it).

        Returns:
            Iterable of :class:`optiplug.Problem`; all plugins' problems are
            collected and reported together.
        """
        return ()

    @hookspec
    def optiplug_cli_commands(self) -> Iterable[CommandSpec]:
        """Return the ``optiplug`` subcommands this plugin provides.

        Returns:
            Iterable of :class:`optiplug.CommandSpec`. The core's own commands
            (``list``, ``show``, ``train``...) come through this hook too.
        """
        return ()


HOOK_NAMES = frozenset(name for name in vars(HookSpecs) if name.startswith("optiplug_"))
"""Every hook a plugin may implement."""
