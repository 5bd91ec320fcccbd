"""The ``optiplug`` command line (also ``python -m optiplug``).

Each subcommand is a small :class:`Command` record in :data:`COMMANDS`: a
name, a help line, a function adding its arguments, and a function running
it. Errors from optiplug print one friendly line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._api import default_registry
from .._core.registry import Registry
from .._core.specs import OptimizerSpec, ScheduleSpec
from .._text import format_table
from .._train import command as _cli_train
from ..errors import OptiplugError, UnknownOptimizerError
from . import auto as _cli_auto
from . import check as _cli_check
from . import schedule as _cli_schedule

__all__ = ["COMMANDS", "Command", "main"]


@attrs.frozen
class Command:
    """One ``optiplug`` subcommand."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# ------------------------------------------------------------------ list
def _implementation_names(registry: Registry, spec: OptimizerSpec) -> list[str]:
    return [i.name for i in registry.implementations(spec.name, provider=spec.provider.plugin)]


def _listing(registry: Registry) -> dict[str, list[dict[str, Any]]]:
    registry.plugins()  # discover
    optimizers = [
        {
            "name": spec.name,
            "aliases": list(spec.aliases),
            "implementations": _implementation_names(registry, spec),
            **_provider_fields(spec),
            "summary": spec.summary,
        }
        for spec in registry.optimizer_specs()
    ]
    schedules = [
        {
            "name": spec.name,
            "aliases": list(spec.aliases),
            **_provider_fields(spec),
            "summary": spec.summary,
        }
        for spec in registry.schedule_specs()
    ]
    plugins = [attrs.asdict(info) for info in registry.plugins()]
    rules = [
        {
            "name": p["name"],
            "plugin": p["name"],
            "distribution": p["distribution"],
            "version": p["version"],
        }
        for p in plugins
        if f"rule:{p['name']}" in p["provides"]
    ]
    return {"optimizers": optimizers, "schedules": schedules, "rules": rules, "plugins": plugins}


def _provider_fields(spec: OptimizerSpec | ScheduleSpec) -> dict[str, str]:
    info = spec.provider
    assert info is not None, "registry records always carry their provider"
    return {"plugin": info.plugin, "distribution": info.distribution, "version": info.version}


def _list_rows(listing: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for kind, key in (("optimizer", "optimizers"), ("schedule", "schedules"), ("rule", "rules")):
        for item in listing[key]:
            impls = ",".join(item.get("implementations", ())) or "-"
            rows.append(
                [
                    kind,
                    item["name"],
                    impls,
                    item["plugin"],
                    item["distribution"],
                    item["version"],
                    "active",
                ]
            )
    for plugin in listing["plugins"]:
        if plugin["status"] != "active":
            rows.append(
                [
                    "plugin",
                    plugin["name"],
                    "-",
                    plugin["name"],
                    plugin["distribution"],
                    plugin["version"],
                    plugin["status"],
                ]
            )
    return rows


def _run_list(args: argparse.Namespace) -> int:
    listing = _listing(default_registry())
    if args.json:
        print(json.dumps(listing, indent=2, default=str))
        return 0
    header = ["kind", "name", "implementations", "plugin", "distribution", "version", "status"]
    print(format_table(header, _list_rows(listing)))
    problems = [p for p in listing["plugins"] if p["status"] != "active"]
    for plugin in problems:
        origin = f"{plugin['distribution']} {plugin['version']}"
        print(f"\n{plugin['status']}: plugin {plugin['name']} ({origin}): {plugin['error']}")
    return 0


def _configure_list(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


# ------------------------------------------------------------------ show
def _show_optimizer(registry: Registry, spec: OptimizerSpec) -> str:
    lines = [f"{spec.name} - {spec.summary}", f"provider: {spec.provider}"]
    if spec.aliases:
        lines.append(f"aliases: {', '.join(spec.aliases)}")
    lines.append(f"implementations: {', '.join(_implementation_names(registry, spec)) or '-'}")
    lines += ["", "hyperparameters:"]
    rows = [[h.name, repr(h.default), h.constraint or "-"] for h in spec.hyperparameters]
    lines.append(_indent(format_table(["name", "default", "constraint"], rows)))
    lines += ["", "state slots:"]
    if spec.state_slots is None:
        lines.append("  (not declared: generic checks only)")
    else:
        rows = [
            [
                s.name,
                s.shape,
                s.dtype,
                s.when or "always",
                ", ".join(s.constraints) or "-",
                s.description,
            ]
            for s in spec.state_slots
        ]
        header = ["slot", "shape", "dtype", "present when", "constraints", "description"]
        lines.append(_indent(format_table(header, rows)))
    if spec.description and spec.description.strip() != spec.summary:
        lines += ["", spec.description.strip()]
    return "\n".join(lines)


def _show_schedule(spec: ScheduleSpec) -> str:
    lines = [f"{spec.name} - {spec.summary}", f"provider: {spec.provider}"]
    if spec.aliases:
        lines.append(f"aliases: {', '.join(spec.aliases)}")
    describe = getattr(spec.factory, "describe", None)
    if callable(describe):
        lines += ["", describe()]
    elif spec.description and spec.description.strip() != spec.summary:
        lines += ["", spec.description.strip()]
    return "\n".join(lines)


def _run_show(args: argparse.Namespace) -> int:
    registry = default_registry()
    try:
        print(_show_optimizer(registry, registry.spec(args.name)))
    except UnknownOptimizerError as optimizer_error:
        try:
            print(_show_schedule(registry.schedule_spec(args.name)))
        except UnknownOptimizerError:
            raise optimizer_error from None
    return 0


def _configure_show(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="an optimizer or schedule name")


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


COMMANDS: list[Command] = [
    Command(
        "list", "list optimizers, implementations, schedules and rules", _configure_list, _run_list
    ),
    Command("show", "describe one optimizer or schedule", _configure_show, _run_show),
    Command(
        "schedule",
        "print a schedule's curve as a table, optionally plot it",
        _cli_schedule.configure,
        _cli_schedule.run,
    ),
    Command(
        "auto",
        "show the AutoOptimizer selection and its explanation",
        _cli_auto.configure_auto,
        _cli_auto.run_auto,
    ),
    Command(
        "check",
        "verify a checkpoint directory and show what it holds",
        _cli_check.configure,
        _cli_check.run,
    ),
    Command(
        "train",
        "train a small character-level language model and report its losses",
        _cli_train.configure,
        _cli_train.run,
    ),
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every command in :data:`COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="optiplug", description="A plugin-based optimizer registry for PyTorch."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``optiplug`` command line.

    Args:
        argv: arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 2 on a usage or optiplug error.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except OptiplugError as error:
        print(f"optiplug: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
