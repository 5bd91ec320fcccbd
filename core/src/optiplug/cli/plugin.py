"""The core's built-in commands: ``list``, ``show``, ``schedule``, ``auto``, ``check``.

It answers the same ``optiplug_cli_commands`` hook a third-party plugin does,
so the built-in commands are registered and listed like anyone's
(distribution ``optiplug``). The commands are named by :func:`~optiplug.lazy`
references: importing this module imports none of them (and not torch).
"""

from __future__ import annotations

from .._core.hooks import PLUGIN_API_VERSION, hookimpl
from .._core.specs import CommandSpec
from .._lazy import lazy

__all__ = ["OPTIPLUG_API", "optiplug_cli_commands"]

OPTIPLUG_API = PLUGIN_API_VERSION

_PACKAGE = "optiplug.cli"


def _command(
    name: str, help_text: str, module: str, configure: str, run: str, description: str = ""
) -> CommandSpec:
    return CommandSpec(
        name=name,
        help=help_text,
        configure=lazy(f"{_PACKAGE}.{module}:{configure}"),
        run=lazy(f"{_PACKAGE}.{module}:{run}"),
        description=description,
    )


@hookimpl
def optiplug_cli_commands() -> list[CommandSpec]:
    """Provide the core's commands (``train``, ``bench`` and the others come from other distributions).

    Returns:
        The ``list``, ``show``, ``schedule``, ``auto`` and ``check`` commands.
    """
    return [
        _command(
            "list",
            "list optimizers, implementations, schedules and rules",
            "listing",
            "configure_list",
            "run_list",
        ),
        _command(
            "show", "describe one optimizer or schedule", "listing", "configure_show", "run_show"
        ),
        _command(
            "schedule",
            "print a schedule's curve as a table, optionally plot it",
            "schedule",
            "configure",
            "run",
        ),
        _command(
            "auto",
            "show the AutoOptimizer selection and its explanation",
            "auto",
            "configure_auto",
            "run_auto",
        ),
        _command(
            "check",
            "verify a checkpoint directory and show what it holds",
            "check",
            "configure",
            "run",
        ),
    ]
