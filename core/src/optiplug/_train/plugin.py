"""The core's built-in ``train`` plugin: registers the ``optiplug train`` command.

It answers the ``optiplug_cli_commands`` hook like any plugin would. Importing
it imports neither torch nor numpy: the arguments are defined by
:mod:`optiplug._train.options` (torch-free) and the training application is
imported when the command runs.
"""

from __future__ import annotations

import argparse
import importlib.util

from .._core.hooks import PLUGIN_API_VERSION, hookimpl
from .._core.specs import CommandSpec
from .._lazy import lazy
from ..errors import OptiplugError

__all__ = ["OPTIPLUG_API", "optiplug_cli_commands", "run"]

OPTIPLUG_API = PLUGIN_API_VERSION

_NEEDED = {"numpy": "numpy", "torch": "torch"}
"""Modules the training application imports -> the package that provides them."""


def run(args: argparse.Namespace) -> int:
    """Import the training application and run ``optiplug train``.

    Args:
        args: the parsed ``train`` arguments (``args.registry`` included).

    Returns:
        The command's exit status.

    Raises:
        OptiplugError: a package the application needs is not installed (one
            line naming it), or any error of the run itself.
    """
    missing = next((p for m, p in _NEEDED.items() if importlib.util.find_spec(m) is None), None)
    try:
        if missing is not None:  # before torch, which warns when numpy is missing
            raise ModuleNotFoundError(name=missing)
        from . import command  # deferred: imports torch
    except ModuleNotFoundError as error:
        package = _NEEDED.get((error.name or "").partition(".")[0])
        if package is None:
            raise
        raise OptiplugError(
            f"`optiplug train` needs {package}, which is not installed; "
            f"install it with: pip install {package}"
        ) from None
    return command.run(args)


@hookimpl
def optiplug_cli_commands() -> list[CommandSpec]:
    """Provide the ``train`` and ``tune`` commands.

    Returns:
        Their :class:`~optiplug.CommandSpec` records.
    """
    return [
        CommandSpec(
            name="train",
            help="train a small character-level language model and report its losses",
            configure=lazy("optiplug._train.options:configure"),
            run=run,
        ),
        CommandSpec(
            name="tune",
            help="measure optimizers on the training job: LR range test and a short run each",
            configure=lazy("optiplug._train.tune_command:configure"),
            run=lazy("optiplug._train.tune_command:run"),
        ),
    ]
