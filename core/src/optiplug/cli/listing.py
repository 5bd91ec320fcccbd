"""``optiplug list`` and ``optiplug show NAME``: what is installed, and one record in detail."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._auto.model_config import parse_parameter_count
from .._core.naming import qualified_name
from .._core.registry import Registry
from .._core.specs import ImplementationSpec, OptimizerSpec, ProviderInfo, ScheduleSpec
from .._state.memory import MemoryEstimate, estimate
from .._text import format_table
from ..errors import (
    ModelConfigError,
    OptiplugError,
    PluginConflictError,
    UnknownOptimizerError,
)
from ..validators import STATE_PRECISIONS
from .schedule import parse_param

__all__ = [
    "Listing",
    "UnknownNameError",
    "configure_list",
    "configure_show",
    "format_bytes",
    "listing",
    "parse_count",
    "read_negative_values",
    "run_list",
    "run_show",
    "show_memory",
    "show_optimizer",
    "show_schedule",
    "unavailable_implementations",
]

Listing = dict[str, Any]
"""``{"optimizers", "schedules", "rules", "plugins"}``: lists of JSON-ready records."""

_LIST_HEADER = ["kind", "name", "implementations", "plugin", "distribution", "version", "status"]


# ------------------------------------------------------------------ list
def configure_list(parser: argparse.ArgumentParser) -> None:
    """Add the ``list`` command's arguments to ``parser``."""
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--provider",
        metavar="NAME",
        help="only what this plugin or distribution provides (e.g. heavyball, optiplug-adamw)",
    )


def run_list(args: argparse.Namespace) -> int:
    """Print every optimizer, schedule, rule and plugin problem of ``args.registry``.

    Args:
        args: the parsed arguments (``json``, ``provider``, ``registry``).

    Returns:
        0.
    """
    found = listing(args.registry, provider=getattr(args, "provider", None))
    if args.json:
        print(json.dumps(found, indent=2, default=str))
        return 0
    print(format_table(_LIST_HEADER, _list_rows(found)))
    notes = [
        f"unavailable: implementation {name!r} of {item['name']}: {reason}"
        for item in found["optimizers"]
        for name, reason in item["unavailable"].items()
    ]
    notes += [
        f"limited: {item['name']}: {item['origin']['limitation']}"
        for item in found["optimizers"]
        if item["origin"] and item["origin"]["limitation"]
    ]
    notes += [_clash_note(name, clash) for name, clash in found["clashes"].items()]
    if notes:
        print("\n" + "\n".join(notes))
    for plugin in (p for p in found["plugins"] if p["status"] != "active"):
        origin = f"{plugin['distribution']} {plugin['version']}"
        print(f"\n{plugin['status']}: plugin {plugin['name']} ({origin}): {plugin['error']}")
    return 0


def listing(registry: Registry, *, provider: str | None = None) -> Listing:
    """Everything ``registry`` provides, as JSON-ready records.

    An optimizer whose plain name several plugins provide is listed under
    the name that reaches it: the plain name for the native one that keeps
    it, the qualified name (``plugin:name``) otherwise; ``clashes`` says who
    provides each contested name.

    Args:
        registry: the registry to describe (its plugins are discovered first).
        provider: only what this plugin or distribution provides; None for all.

    Returns:
        The optimizers, schedules, selection rules, plugins and clashes.
    """
    plugins = [attrs.asdict(info) for info in registry.plugins()]
    clashes = registry.clashes()
    optimizers = [_optimizer_record(registry, spec, clashes) for spec in registry.optimizer_specs()]
    found: Listing = {
        "optimizers": optimizers,
        "schedules": [_schedule_record(spec) for spec in registry.schedule_specs()],
        "rules": [_rule_record(p) for p in plugins if _has_active_rule(p)],
        "plugins": plugins,
        "clashes": {name: _clash_record(registry, name, names) for name, names in clashes.items()},
    }
    return found if provider is None else _only_from(found, provider)


def _only_from(found: Listing, provider: str) -> Listing:
    """``found`` restricted to the records of plugin or distribution ``provider``."""

    def mine(item: dict[str, Any]) -> bool:
        return provider in (item.get("plugin"), item.get("distribution"), item.get("name"))

    kept: Listing = {key: [item for item in found[key] if mine(item)] for key in _LISTED}
    names = {item["name"].rpartition(":")[2] for item in kept["optimizers"]}
    kept["clashes"] = {k: v for k, v in found["clashes"].items() if k in names}
    return kept


_LISTED = ("optimizers", "schedules", "rules", "plugins")


def _optimizer_record(
    registry: Registry, spec: OptimizerSpec, clashes: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    return {
        "name": registry.name_of(spec),
        "qualified_name": qualified_name(spec),
        "aliases": list(spec.aliases),
        "implementations": _implementation_names(registry, spec),
        "unavailable": unavailable_implementations(registry, spec),
        **_provider_fields(spec),
        "origin": attrs.asdict(spec.origin) if spec.origin is not None else None,
        "contested": spec.name in clashes,
        "summary": spec.summary,
    }


def _clash_record(registry: Registry, name: str, qualified: Sequence[str]) -> dict[str, Any]:
    try:
        winner: str | None = qualified_name(registry.spec(name))
    except PluginConflictError:
        winner = None
    return {"providers": list(qualified), "plain_name_resolves_to": winner}


def _clash_note(name: str, clash: Mapping[str, Any]) -> str:
    """``clash: 'adamw' is provided by ...; the plain name resolves to ...``."""
    winner = clash["plain_name_resolves_to"]
    resolves = (
        f"the plain name is the native {winner}"
        if winner is not None
        else "the plain name resolves to none of them: use a qualified name"
    )
    return f"clash: {name!r} is provided as {', '.join(clash['providers'])}; {resolves}"


def _schedule_record(spec: ScheduleSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "aliases": list(spec.aliases),
        **_provider_fields(spec),
        "summary": spec.summary,
    }


def _has_active_rule(plugin: dict[str, Any]) -> bool:
    """Whether ``plugin`` is active and has a selection rule (a failed rule is not listed)."""
    return plugin["status"] == "active" and f"rule:{plugin['name']}" in plugin["provides"]


def _rule_record(plugin: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": plugin["name"],
        "plugin": plugin["name"],
        "distribution": plugin["distribution"],
        "version": plugin["version"],
    }


def _provider(spec: OptimizerSpec | ScheduleSpec) -> ProviderInfo:
    if spec.provider is None:
        raise AssertionError(f"registry record {spec.name!r} lacks its provider")
    return spec.provider


def _provider_fields(spec: OptimizerSpec | ScheduleSpec) -> dict[str, str]:
    info = _provider(spec)
    return {"plugin": info.plugin, "distribution": info.distribution, "version": info.version}


def _implementation_names(registry: Registry, spec: OptimizerSpec) -> list[str]:
    provider = _provider(spec).plugin
    return [i.name for i in registry.implementations(spec.name, provider=provider)]


def _availability(impl: ImplementationSpec) -> str | None:
    """Why ``impl`` cannot run on this machine, or None; a check that raises gives its error."""
    try:
        reason = impl.unavailable_reason()
    except Exception as error:
        return f"availability check raised {type(error).__name__}: {error}"
    return None if reason is None else str(reason)


def unavailable_implementations(registry: Registry, spec: OptimizerSpec) -> dict[str, str]:
    """The implementations of ``spec`` that cannot run on this machine, with the reason.

    Args:
        registry: where its implementations are registered.
        spec: the optimizer.

    Returns:
        ``{implementation name: reason}`` (``impl=None`` never picks these;
        forcing one raises :class:`~optiplug.errors.OptimizerUnavailableError`).
    """
    found = {}
    for impl in registry.implementations(spec.name, provider=_provider(spec).plugin):
        reason = _availability(impl)
        if reason is not None:
            found[impl.name] = reason
    return found


def _implementations_line(registry: Registry, spec: OptimizerSpec) -> str:
    """``"foreach, fused, loop, triton (unavailable: needs a CUDA device)"``, for ``show``.

    An implementation that cannot run on this machine is marked unavailable
    with the reason; one this process skipped because it raised is marked
    failed.
    """
    failed = registry.implementation_failures(spec.name, provider=_provider(spec).plugin)
    unavailable = unavailable_implementations(registry, spec)
    names = []
    for name in _implementation_names(registry, spec):
        if name in unavailable:
            name += f" (unavailable: {unavailable[name]})"
        elif name in failed:
            name += f" (failed: {failed[name]})"
        names.append(name)
    return ", ".join(names) or "-"


def _list_rows(found: Listing) -> list[list[str]]:
    rows = []
    for kind, key in (("optimizer", "optimizers"), ("schedule", "schedules"), ("rule", "rules")):
        for item in found[key]:
            unavailable = item.get("unavailable", {})
            impls = (
                ",".join(
                    name + ("(unavailable)" if name in unavailable else "")
                    for name in item.get("implementations", ())
                )
                or "-"
            )
            origin = [item["plugin"], item["distribution"], item["version"]]
            limited = (item.get("origin") or {}).get("limitation")
            rows.append([kind, item["name"], impls, *origin, "limited" if limited else "active"])
    for plugin in found["plugins"]:
        if plugin["status"] != "active":
            origin = [plugin["name"], plugin["distribution"], plugin["version"]]
            rows.append(["plugin", plugin["name"], "-", *origin, plugin["status"]])
    return rows


# ------------------------------------------------------------------ show
def parse_count(text: str) -> int:
    """``--params``: a parameter count (``7B``, ``125M``, ``1.3b``, ``7e9``), as for ``auto``.

    Raises:
        argparse.ArgumentTypeError: not a whole, positive count (argparse
            prints it as one usage line).
    """
    try:
        return parse_parameter_count(text)
    except ModelConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


_NEGATIVE_VALUE = re.compile(r"-\.?\d")
"""What argparse takes for a negative number from Python 3.14 on: a dash, then a digit."""


def read_negative_values(parser: argparse.ArgumentParser) -> None:
    """Let ``parser`` read ``--option -1GB`` as the option's value, as Python 3.14's argparse does.

    Before Python 3.14 argparse takes a word that starts with a dash for an
    option unless it is a plain negative number (``-5``), so ``--params -4M``
    or ``--memory-budget -1GB`` stopped at "expected one argument" instead
    of reaching the value's parser, which names the value and refuses it as
    not positive. ``parser`` must have no option that starts with a dash
    and a digit (none of optiplug's commands has one).

    Args:
        parser: a subcommand's parser.
    """
    parser._negative_number_matcher = _NEGATIVE_VALUE


def configure_show(parser: argparse.ArgumentParser) -> None:
    """Add the ``show`` command's arguments to ``parser``."""
    read_negative_values(parser)
    parser.add_argument("name", help="an optimizer or schedule name")
    sizing = parser.add_argument_group("state memory estimate (optimizers)")
    sizing.add_argument(
        "--params",
        type=parse_count,
        metavar="N",
        help="estimate the state memory for N parameters (7B, 125M, 1.3b, 7e9)",
    )
    sizing.add_argument(
        "--dtype", default="float32", help="the parameters' dtype (default: float32; bf16, fp16...)"
    )
    sizing.add_argument(
        "--param",
        type=parse_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a hyperparameter deciding conditional slots, e.g. amsgrad=true (repeatable)",
    )
    sizing.add_argument(
        "--state-precision",
        choices=STATE_PRECISIONS,
        help="how the per-element state is stored: fp32 (default), bf16, int8 or int4 "
        "(the algorithm must take state_precision)",
    )
    sizing.add_argument(
        "--tensors",
        type=parse_count,
        metavar="N",
        help="parameter tensors, for scalar slots such as step (default: one per million "
        "parameters)",
    )


class UnknownNameError(UnknownOptimizerError):
    """``optiplug show NAME``: no optimizer and no schedule is called ``NAME``.

    The suggestion is the closest name of either kind, and the message lists both.

    Args:
        name: what was asked for.
        optimizers: the installed optimizers.
        schedules: the registered schedules.
    """

    kind = "optimizer or schedule"

    def __init__(self, name: str, optimizers: Sequence[str], schedules: Sequence[str]) -> None:
        super().__init__(name, [*optimizers, *schedules])
        kinds = {**dict.fromkeys(schedules, "schedule"), **dict.fromkeys(optimizers, "optimizer")}
        hint = (
            f" Did you mean the {kinds[self.suggestion]} {self.suggestion!r}?"
            if self.suggestion
            else ""
        )
        self.message = (
            f"unknown optimizer {name!r} (not a schedule either).{hint} "
            f"Optimizers: {', '.join(sorted(optimizers)) or '(none installed)'}. "
            f"Schedules: {', '.join(sorted(schedules)) or '(none)'}."
        )
        self.args = (self.message,)


def run_show(args: argparse.Namespace) -> int:
    """Describe optimizer (or else schedule) ``args.name`` of ``args.registry``.

    With ``--params`` an optimizer's description ends with the estimate of
    its state memory (:func:`show_memory`).

    Args:
        args: the parsed arguments (``name``, ``registry``, ``params``,
            ``dtype``, ``param``, ``tensors``).

    Returns:
        0.

    Raises:
        UnknownNameError: no optimizer and no schedule has that name (an
            :class:`~optiplug.errors.UnknownOptimizerError` suggesting the
            closest name of either kind).
        OptiplugError: ``--params`` with a schedule's name.
        HyperparameterError: an unknown ``--dtype`` or ``--param`` name.
    """
    registry: Registry = args.registry
    count = getattr(args, "params", None)
    try:
        spec = registry.spec(args.name)
    except UnknownOptimizerError as optimizer_error:
        try:
            schedule = registry.schedule_spec(args.name)
        except UnknownOptimizerError:
            raise UnknownNameError(
                args.name, registry.optimizers(), registry.schedules()
            ) from optimizer_error
        if count is not None:
            raise OptiplugError(f"--params: {args.name} is a schedule, not an optimizer") from None
        print(show_schedule(schedule))
        return 0
    text = show_optimizer(registry, spec)
    if count is not None:
        hparams = {key.replace("-", "_"): _flag(value) for key, value in args.param}
        if args.state_precision is not None:
            hparams["state_precision"] = args.state_precision
        found = estimate(spec, count, dtype=args.dtype, num_tensors=args.tensors, hparams=hparams)
        text += "\n\n" + show_memory(found)
    print(text)
    return 0


def _flag(value: Any) -> Any:
    """``true``/``false`` (as typed on a command line) as booleans; anything else as parsed."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def format_bytes(size: int) -> str:
    """``28.0 GB (26.1 GiB)``: decimal gigabytes and binary gibibytes; small sizes in bytes.

    Args:
        size: bytes.

    Returns:
        The size, as text.
    """
    if size < 10**6:
        return f"{size:,} B"
    return f"{size / 1e9:,.2f} GB ({size / 2**30:,.2f} GiB)"


def show_memory(found: MemoryEstimate) -> str:
    """The state memory estimate: the total, each slot, what was not counted and why.

    Args:
        found: the estimate.

    Returns:
        Lines of text.
    """
    rows = [[slot, f"{size:,}", format_bytes(size)] for slot, size in found.by_slot.items()]
    ratio = f", {found.total / found.parameters:.2f}x the parameters" if found.parameters else ""
    if found.num_parameters:
        ratio += f", {found.total / found.num_parameters:.3g} bytes per parameter"
    lines = [
        f"state memory for {found.num_parameters:,} {found.dtype} parameters: "
        f"{format_bytes(found.total)}{ratio}",
        _indent(format_table(["slot", "bytes", "size"], rows)) if rows else "  (no state)",
        f"  parameters themselves: {format_bytes(found.parameters)}; scalar slots counted "
        f"once per parameter tensor, {found.num_tensors:,} assumed (--tensors)",
    ]
    lines += [f"  not counted: {reason}" for reason in found.omitted]
    return "\n".join(lines)


def show_optimizer(registry: Registry, spec: OptimizerSpec) -> str:
    """An optimizer's summary, provider, implementations, hyperparameters and state slots.

    Args:
        registry: where its implementations are registered.
        spec: the optimizer.

    Returns:
        The description, as lines of text.
    """
    lines = [f"{registry.name_of(spec)} - {spec.summary}", f"provider: {spec.provider}"]
    if spec.aliases:
        lines.append(f"aliases: {', '.join(spec.aliases)}")
    lines += _origin_lines(spec)
    lines.append(f"implementations: {_implementations_line(registry, spec)}")
    rows = [[h.name, repr(h.default), h.constraint or "-"] for h in spec.hyperparameters]
    lines += [
        "",
        "hyperparameters:",
        _indent(format_table(["name", "default", "constraint"], rows)),
    ]
    lines += ["", "state slots:", _state_slots(spec)]
    if spec.description and spec.description.strip() != spec.summary:
        lines += ["", spec.description.strip()]
    return "\n".join(lines)


def _origin_lines(spec: OptimizerSpec) -> list[str]:
    """Where a bridged algorithm comes from, and what else the checks need to know of it."""
    lines = []
    origin = spec.origin
    if origin is not None:
        version = f" {origin.version}" if origin.version else ""
        lines.append(f"bridged from: {origin.library}{version} ({origin.target or '?'})")
        if origin.paper:
            lines.append(f"paper: {origin.paper}")
        if origin.limitation:
            lines.append(f"limited: {origin.limitation}")
    if spec.train_eval:
        lines.append(
            "lifecycle: call optimizer.train() before steps, optimizer.eval() before evaluating"
        )
    if spec.step_closure:
        lines.append("step: needs step(closure); optiplug.base.training_step passes one")
    if spec.create_graph:
        lines.append("backward: needs create_graph=True (Graph and training_step keep it)")
    if spec.group_state:
        lines.append(f"group state (running, not hyperparameters): {', '.join(spec.group_state)}")
    if spec.example_shape is not None or spec.example_dtype is not None:
        shape = "x".join(map(str, spec.example_shape or (4, 4)))
        lines.append(f"checked on: a {shape} {spec.example_dtype or 'float64'} parameter")
    return lines


def _state_slots(spec: OptimizerSpec) -> str:
    if spec.state_slots is None:
        return "  (not declared: generic checks only)"
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
    return _indent(format_table(header, rows))


def show_schedule(spec: ScheduleSpec) -> str:
    """A schedule's summary, provider, aliases and its own description.

    Args:
        spec: the schedule.

    Returns:
        The description, as lines of text.
    """
    lines = [f"{spec.name} - {spec.summary}", f"provider: {spec.provider}"]
    if spec.aliases:
        lines.append(f"aliases: {', '.join(spec.aliases)}")
    describe = getattr(spec.factory, "describe", None)
    if callable(describe):
        lines += ["", describe()]
    elif spec.description and spec.description.strip() != spec.summary:
        lines += ["", spec.description.strip()]
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
