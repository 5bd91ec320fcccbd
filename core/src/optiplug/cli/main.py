"""The ``optiplug`` command line (also ``python -m optiplug``).

Every subcommand is a :class:`~optiplug.CommandSpec` that a plugin returns from
the ``optiplug_cli_commands`` hook; the core's own (``list``, ``show``,
``train``...) come from its built-in plugins the same way, entry points of
the ``optiplug`` distribution that :func:`main` loads into its registry. The
registry is resolved once, here (the default registry unless one is given),
and handed to the command as ``args.registry``. Errors from optiplug print
one friendly line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .._core.builtin import DISTRIBUTION
from .._core.registry import Registry, bound_registry
from ..errors import OptiplugError

__all__ = ["COMMAND_DISTRIBUTIONS", "build_parser", "main"]

COMMAND_DISTRIBUTIONS = (DISTRIBUTION, "optiplug-train", "optiplug-devtools")
"""The distributions whose commands every ``optiplug`` command line offers, where installed."""


def build_parser(registry: Registry) -> argparse.ArgumentParser:
    """The argument parser for every command ``registry`` knows.

    Args:
        registry: where the commands are registered (``registry.command_specs()``).

    Returns:
        A parser whose namespaces carry the chosen command's ``run``.
    """
    parser = argparse.ArgumentParser(
        prog="optiplug", description="A plugin-based optimizer registry for PyTorch."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for spec in registry.command_specs():
        sub = subparsers.add_parser(
            spec.name, help=spec.help, description=spec.description or spec.help
        )
        spec.configure(sub)
        sub.set_defaults(run=spec.run)
    return parser


def main(argv: Sequence[str] | None = None, *, registry: Registry | None = None) -> int:
    """Run the ``optiplug`` command line.

    Args:
        argv: arguments without the program name; defaults to ``sys.argv[1:]``.
        registry: where commands, optimizers and schedules are looked up;
            the default registry when None.

    Returns:
        The exit status: the command's own, or 2 on a usage or optiplug error.
    """
    try:
        registry = bound_registry(registry)
        for distribution in COMMAND_DISTRIBUTIONS:  # the commands, even without autoload
            registry.load_distribution(distribution)
        args = build_parser(registry).parse_args(argv)
        args.registry = registry
        return int(args.run(args))
    except OptiplugError as error:
        print(f"optiplug: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
