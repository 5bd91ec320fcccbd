"""Fit an ``AutoOptimizer`` selection to a memory budget per device.

The memory counted is the training job's own: the parameters, their
gradients (same dtype and size as the trainable parameters) and the
optimizer state (:func:`optiplug._state.memory.estimate`, from the
algorithm's declared state slots). Activations and temporary buffers are not
counted. When the rules' choice does not fit, the same algorithm is tried
with its state kept at ``bf16``, ``int8`` and ``int4`` (when it takes
``state_precision``), then the other candidates the rules proposed, in rank
order, the same way; the first that fits is chosen. When nothing fits, the
rules' choice is returned unchanged, and its :class:`MemoryPlan` says how
many FSDP ranks would hold the most compact option.

Torch-free: :func:`model_footprint` reads a module's parameters without
importing torch.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .._core.selection import (
    CandidateReport,
    MemoryOption,
    MemoryPlan,
    Selection,
    format_size,
    ranks_to_fit,
)
from .._core.specs import Candidate, OptimizerSpec
from .._state.memory import dtype_bytes, estimate
from ..errors import HyperparameterError, OptiplugError
from ..validators import STATE_PRECISIONS

if TYPE_CHECKING:
    import torch

    from .._core.registry import Registry

__all__ = [
    "Footprint",
    "apply_memory_budget",
    "config_footprint",
    "count_footprint",
    "model_footprint",
    "parse_memory_budget",
]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(
    r"^\s*([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]*)\s*$", re.IGNORECASE
)
_EXPECTED = (
    "a budget must be a finite positive size: a number of bytes or a size such as '24GB' "
    "(GB = 1e9 bytes), '80 GiB' (GiB = 2**30 bytes) or '512MB'"
)
_LARGEST = sys.float_info.max
"""The largest budget, in bytes: one finite as a float, so every figure of the plan is."""


@attrs.frozen
class Footprint:
    """What the model itself takes on a device, besides its optimizer state.

    Attributes:
        num_parameters: trainable parameter elements (what the state is sized by).
        dtype: the trainable parameters' dtype name, for the state estimate.
        parameters: bytes of all parameters.
        gradients: bytes of the gradients (one per trainable parameter).
        notes: assumptions behind the figures.
    """

    num_parameters: int
    dtype: str
    parameters: int
    gradients: int
    notes: tuple[str, ...] = ()


# ------------------------------------------------------------------ the budget
def parse_memory_budget(value: Any) -> int:
    """A memory budget in bytes, from bytes or a size string.

    A budget must be a finite positive size: at least one byte, and finite
    as a float (``"1e400GB"`` is refused, not an ``OverflowError``).

    Args:
        value: an int of bytes (a whole float such as ``24e9`` too), or a
            string: a number and a unit, ``B``, ``KB``/``MB``/``GB``/``TB``
            (powers of 1000) or ``KiB``/``MiB``/``GiB``/``TiB`` (powers of
            1024), case-insensitive, spaces allowed (``"80 GiB"``).

    Returns:
        The budget in bytes (> 0).

    Raises:
        HyperparameterError: anything else, zero, negative, under one byte
            or not finite (names ``memory_budget`` and the value).
    """
    if isinstance(value, str):
        return _parse_size(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HyperparameterError("memory_budget", value, _EXPECTED)
    problem = _size_problem(value)
    if problem is None and value != int(value):
        problem = "it is not a whole number of bytes"
    if problem is not None:
        raise HyperparameterError("memory_budget", value, f"{problem}; {_EXPECTED}")
    return int(value)


def _parse_size(text: str) -> int:
    """A size string in bytes: ``"24GB"``, ``"80 GiB"``, ``"-1GB"`` refused as negative."""
    match = _SIZE.match(text)
    unit = match.group(4).lower() if match else ""
    if match is None or unit not in _UNITS:
        hint = ""
        if match is not None and unit in ("k", "m", "g", "t"):
            hint = (
                f" ({unit.upper()} alone is ambiguous: write {unit.upper()}B or {unit.upper()}iB)"
            )
        raise HyperparameterError("memory_budget", text, _EXPECTED + hint)
    sign, number, exponent = match.group(1), match.group(2), match.group(3) or "0"
    zero = float(number) == 0  # as typed: 1e-400 underflows to 0.0 but is no zero
    size = float(f"{number}e{exponent}") * _UNITS[unit]  # inf, never an OverflowError
    problem = "it is negative" if sign == "-" and not zero else _size_problem(size, zero=zero)
    if problem is not None:
        raise HyperparameterError("memory_budget", text, f"{problem}; {_EXPECTED}")
    return int(size)


def _size_problem(size: float, *, zero: bool | None = None) -> str | None:
    """Why ``size`` bytes is no budget (not finite, negative, zero, under a byte), or None.

    Args:
        size: the budget in bytes.
        zero: whether the size as typed is zero (None: whether ``size`` is).
    """
    if size > _LARGEST or (isinstance(size, float) and not math.isfinite(size)):
        return "it is not finite (more than 1.8e308 bytes, the largest float)"
    if size < 0:
        return "it is negative"
    if size >= 1:
        return None
    if zero is None:
        zero = size == 0
    return "it is zero" if zero else "it is less than one byte"


# ------------------------------------------------------------------ the model
def count_footprint(
    num_parameters: int, dtype: str = "float32", notes: tuple[str, ...] = ()
) -> Footprint:
    """The footprint of ``num_parameters`` trainable parameters of ``dtype``.

    Args:
        num_parameters: the parameter count.
        dtype: the parameters' dtype name.
        notes: assumptions to carry into the explanation.

    Returns:
        The footprint: parameters and gradients ``num_parameters x dtype size`` each.
    """
    name, size = dtype_bytes(dtype)
    return Footprint(num_parameters, name, num_parameters * size, num_parameters * size, notes)


def config_footprint(config: Mapping[str, Any] | None, num_parameters: int) -> Footprint:
    """The footprint of a model described by an HF-style config (or by its count alone).

    The dtype is the config's ``torch_dtype`` (or ``dtype``, its newer name)
    when it names one; float32 otherwise, which the notes say.

    Args:
        config: the config mapping, or None.
        num_parameters: the parameter count (from the config or given).

    Returns:
        The footprint.
    """
    declared = None
    for key in ("torch_dtype", "dtype"):
        if config is not None and config.get(key) is not None:
            declared = config[key]
            break
    if declared is None:
        return count_footprint(num_parameters, "float32", ("float32 parameters assumed",))
    try:
        name, _ = dtype_bytes(str(declared))
    except HyperparameterError:
        note = f"the config's dtype {declared!r} names no dtype: float32 parameters assumed"
        return count_footprint(num_parameters, "float32", (note,))
    return count_footprint(num_parameters, name, (f"the config's dtype: {name}",))


def model_footprint(model: torch.nn.Module) -> Footprint:
    """The footprint of a module: its parameters' bytes, gradients of the trainable ones.

    Frozen parameters count as parameters only. The state is estimated at
    the dtype most trainable elements have.

    Args:
        model: the module.

    Returns:
        The footprint.
    """
    parameters = gradients = trainable = 0
    elements: dict[str, int] = {}
    for param in model.parameters():
        size = param.numel() * param.element_size()
        parameters += size
        if param.requires_grad:
            gradients += size
            trainable += param.numel()
            dtype = str(param.dtype).removeprefix("torch.")
            elements[dtype] = elements.get(dtype, 0) + param.numel()
    notes: list[str] = []
    dtype = max(elements, key=elements.__getitem__) if elements else "float32"
    if len(elements) > 1:
        notes.append(f"mixed parameter dtypes: state estimated at {dtype}, the most common")
    try:
        dtype, _ = dtype_bytes(dtype)
    except HyperparameterError:
        notes.append(f"state estimated at float32 (parameters of dtype {dtype})")
        dtype = "float32"
    if parameters > gradients:
        notes.append(
            f"{format_size(parameters - gradients)} of frozen parameters: no gradients, no state"
        )
    return Footprint(trainable, dtype, parameters, gradients, tuple(notes))


# ------------------------------------------------------------------ fitting
def apply_memory_budget(
    selection: Selection, budget: int, footprint: Footprint, registry: Registry
) -> Selection:
    """Fit ``selection`` to ``budget`` bytes per device (see the module's docstring).

    Args:
        selection: the rules' selection.
        budget: bytes per device (> 0).
        footprint: the model's parameters and gradients.
        registry: where the candidates' specs are looked up.

    Returns:
        The selection that fits, with its :class:`MemoryPlan` in ``memory``;
        or the rules' choice unchanged, its plan saying it does not fit.
    """
    tried: list[MemoryOption] = []
    notes = list(footprint.notes)
    if footprint.dtype != "float32":
        notes.append(
            f"state_precision fp32 keeps the state in the parameters' dtype ({footprint.dtype})"
        )
    usable = [report for report in selection.candidates if report.status != "skipped"]
    chosen: MemoryOption | None = None
    for index, report in enumerate(usable):
        options = _options(report.candidate, footprint, registry, notes)
        if index == 0:
            if not options:  # the rules' choice cannot be counted: leave it as it is
                plan = _plan(budget, footprint, None, tried, notes, fits=None)
                return attrs.evolve(selection, memory=plan)
            chosen = options[0]
        for position, option in enumerate(options):
            tried.append(option)
            if option.total <= budget:
                plan = _plan(budget, footprint, option, tried, notes, fits=True)
                lowered = position > 0  # below the candidate's own state precision
                return _fitted(selection, report, option, plan, first=index == 0, lowered=lowered)
    compact = min(tried, key=lambda option: option.total)
    plan = _plan(budget, footprint, chosen, tried, notes, fits=False)
    plan = attrs.evolve(plan, compact=compact, fsdp_ranks=ranks_to_fit(compact.total, budget))
    return attrs.evolve(selection, memory=plan)


def _plan(
    budget: int,
    footprint: Footprint,
    chosen: MemoryOption | None,
    tried: list[MemoryOption],
    notes: list[str],
    *,
    fits: bool | None,
) -> MemoryPlan:
    return MemoryPlan(
        budget=budget,
        num_parameters=footprint.num_parameters,
        dtype=footprint.dtype,
        fits=fits,
        chosen=chosen,
        tried=tried,
        notes=notes,
    )


def _options(
    candidate: Candidate, footprint: Footprint, registry: Registry, notes: list[str]
) -> list[MemoryOption]:
    """The candidate at each state precision it may take, most precise first.

    A candidate whose state cannot be estimated gives none, and a note why.
    """
    try:
        spec = registry.spec(candidate.algorithm)
        return [
            _option(spec, candidate, footprint, precision, notes)
            for precision in _precisions(spec, candidate.hparams)
        ]
    except OptiplugError as error:
        rule = f" (rule {candidate.rule})" if candidate.rule else ""
        notes.append(f"{candidate.algorithm}{rule}: state memory not estimated: {error}")
        return []


def _precisions(spec: OptimizerSpec, hparams: Mapping[str, Any]) -> list[str | None]:
    """The ladder from the candidate's own state precision down to int4; [None] without one."""
    declared = {h.name: h for h in spec.hyperparameters}.get("state_precision")
    if declared is None:
        return [None]
    own = hparams.get("state_precision", spec.defaults.get("state_precision", declared.default))
    allowed = {part.strip() for part in str(declared.constraint or "").split("|")}
    if not allowed & set(STATE_PRECISIONS):
        allowed = set(STATE_PRECISIONS)
    start = STATE_PRECISIONS.index(own) if own in STATE_PRECISIONS else 0
    return [own] + [p for p in STATE_PRECISIONS[start + 1 :] if p in allowed]


def _option(
    spec: OptimizerSpec,
    candidate: Candidate,
    footprint: Footprint,
    precision: str | None,
    notes: list[str],
) -> MemoryOption:
    """The candidate at ``precision``; a slot the estimate could not place goes to ``notes``."""
    known = {h.name for h in spec.hyperparameters} | set(spec.defaults)
    hparams = {k: v for k, v in candidate.hparams.items() if k in known}
    if precision is not None:
        hparams["state_precision"] = precision
    state = estimate(spec, footprint.num_parameters, dtype=footprint.dtype, hparams=hparams)
    for omitted in state.omitted:
        note = f"{spec.name}'s estimate leaves out {omitted}"
        if "per param group" in omitted and note not in notes:
            notes.append(note)
    return MemoryOption(
        algorithm=candidate.algorithm,
        state_precision=precision,
        parameters=footprint.parameters,
        gradients=footprint.gradients,
        state=state.total,
        rule=candidate.rule,
    )


def _fitted(
    selection: Selection,
    report: CandidateReport,
    option: MemoryOption,
    plan: MemoryPlan,
    *,
    first: bool,
    lowered: bool,
) -> Selection:
    """The selection of ``report``'s candidate, its state at ``option``'s precision.

    ``first``: the candidate is the rules' choice; ``lowered``: its state
    precision was lowered from its own to fit.
    """
    candidate = report.candidate
    hparams = dict(candidate.hparams)
    if lowered:
        hparams["state_precision"] = option.state_precision
    if first:
        reason = selection.reason
        if lowered:
            reason += f"; state kept at {option.state_precision} to fit the memory budget"
        return attrs.evolve(selection, hparams=hparams, reason=reason, memory=plan)
    reason = (
        f"{candidate.reason}; chosen because the rules' first choice does not fit the memory "
        f"budget (state at {option.state_precision or 'its own precision'})"
    )
    return attrs.evolve(
        selection,
        name=candidate.algorithm,
        hparams=hparams,
        schedule=candidate.schedule,
        reason=reason,
        candidates=_passed_over(selection, report, plan),
        memory=plan,
    )


def _passed_over(
    selection: Selection, winner: CandidateReport, plan: MemoryPlan
) -> tuple[CandidateReport, ...]:
    """The reports with ``winner`` chosen and the candidates tried before it over budget."""
    reports: list[CandidateReport] = []
    ahead = True
    for report in selection.candidates:
        if report is winner:
            ahead = False
            reports.append(CandidateReport(report.candidate, "chosen"))
        elif ahead and report.status != "skipped":
            candidate = report.candidate
            least = min(
                (
                    o.total
                    for o in plan.tried
                    if (o.algorithm, o.rule) == (candidate.algorithm, candidate.rule)
                ),
                default=None,
            )
            note = (
                "its state memory could not be estimated"
                if least is None
                else f"needs at least {format_size(least)}, over the {format_size(plan.budget)} budget"
            )
            reports.append(CandidateReport(report.candidate, "over budget", note))
        else:
            reports.append(report)
    return tuple(reports)
