"""The core's built-in ``leaderboard`` plugin: registers the ``optiplug leaderboard`` command.

It answers the ``optiplug_cli_commands`` hook like any plugin would; importing
it imports no torch (the command's module is named by a lazy reference).
"""

from __future__ import annotations

from .._core.hooks import PLUGIN_API_VERSION, hookimpl
from .._core.specs import CommandSpec
from .._lazy import lazy

__all__ = ["OPTIPLUG_API", "optiplug_cli_commands"]

OPTIPLUG_API = PLUGIN_API_VERSION


@hookimpl
def optiplug_cli_commands() -> list[CommandSpec]:
    """Provide the ``leaderboard`` command.

    Returns:
        Its :class:`~optiplug.CommandSpec`.
    """
    return [
        CommandSpec(
            name="leaderboard",
            help="measure optimizers on the workload suite (resumable) and rank them against AdamW",
            configure=lazy("optiplug._board.command:configure"),
            run=lazy("optiplug._board.command:run"),
            description=(
                "Run the smoke tier (every entry, or --only/--provider, on every workload at a "
                "small lr sweep, seed 0) or the ranked tier (--top entries, --seeds seeds at "
                "their chosen lr), appending each run to --results as one JSON line; rerun the "
                "same command after an interruption to resume. Then print each workload's board "
                "(steps and seconds to the target AdamW reaches, final metric, Welch p vs AdamW)."
            ),
        )
    ]
