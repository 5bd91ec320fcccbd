"""The training application's plugin: the ``train``, ``tune`` and ``leaderboard`` commands.

It answers the ``optiplug_cli_commands`` hook like any plugin would. Importing
it imports neither torch nor numpy: the arguments are defined by
:mod:`optiplug_train.options` (torch-free), the commands are named by lazy
references, and the application is imported when a command runs.
"""

from __future__ import annotations

import argparse
import importlib.util

from optiplug import PLUGIN_API_VERSION, CommandSpec, hookimpl, lazy
from optiplug.errors import OptiplugError

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
    """Provide the ``train``, ``tune`` and ``leaderboard`` commands.

    Returns:
        Their :class:`~optiplug.CommandSpec` records.
    """
    return [
        CommandSpec(
            name="train",
            help="train a small character-level language model and report its losses",
            configure=lazy("optiplug_train.options:configure"),
            run=run,
        ),
        CommandSpec(
            name="tune",
            help="measure optimizers on the training job: LR range test and a short run each",
            configure=lazy("optiplug_train.tune_command:configure"),
            run=lazy("optiplug_train.tune_command:run"),
        ),
        CommandSpec(
            name="leaderboard",
            help="measure optimizers on the workload suite (resumable) and rank them against AdamW",
            configure=lazy("optiplug_train.board.command:configure"),
            run=lazy("optiplug_train.board.command:run"),
            description=(
                "Run the smoke tier (every entry, or --only/--provider, on every workload at a "
                "small lr sweep, seed 0) or the ranked tier (--top entries, --seeds seeds at "
                "their chosen lr), appending each run to --results as one JSON line; rerun the "
                "same command after an interruption to resume. Then print each workload's board "
                "(steps and seconds to the target AdamW reaches, final metric, Welch p vs AdamW)."
            ),
        ),
    ]
