"""The developer tools' plugin: the ``bench`` and ``new-plugin`` commands.

It answers the ``optiplug_cli_commands`` hook like any plugin would; the
commands are named by :func:`~optiplug.lazy` references, so importing this
module imports neither of them (and not torch).
"""

from __future__ import annotations

from optiplug import PLUGIN_API_VERSION, CommandSpec, hookimpl, lazy

__all__ = ["OPTIPLUG_API", "optiplug_cli_commands"]

OPTIPLUG_API = PLUGIN_API_VERSION


@hookimpl
def optiplug_cli_commands() -> list[CommandSpec]:
    """Provide the ``bench`` and ``new-plugin`` commands.

    Returns:
        Their :class:`~optiplug.CommandSpec` records.
    """
    return [
        CommandSpec(
            name="bench",
            help="time every implementation of an algorithm at a given size, against a copy floor",
            configure=lazy("optiplug_devtools.bench:configure"),
            run=lazy("optiplug_devtools.bench:run"),
            description=(
                "For ALGORITHM (default: all) build --params parameters in --tensors equal "
                "tensors on --device, time each implementation's step (median of --steps "
                "interleaved steps after untimed warm-up), compare it with an in-place copy of "
                "the bytes per parameter the update moves, show unavailable and unsupported "
                "implementations with the reason, and mark the one impl=None picks."
            ),
        ),
        CommandSpec(
            name="new-plugin",
            help="write a new plugin distribution to edit, install and test",
            configure=lazy("optiplug_devtools.scaffold:configure"),
            run=lazy("optiplug_devtools.scaffold:run"),
            description=(
                "Write DIR (default ./optiplug-NAME): a plugin distribution whose entry point "
                "NAME provides the optimizer NAME (SGD with momentum, loop and foreach kernels "
                "on optiplug.base.KernelTableOptimizer), with conformance tests. DIR must not "
                "exist or be empty; nothing is written on error."
            ),
        ),
    ]
