"""What defines an ``optiplug train`` run: :class:`TrainConfig`, and the file a saved run leaves.

Importing this module does not import torch.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from optiplug.errors import HyperparameterError, OptiplugError

__all__ = [
    "ADDED_FIELDS",
    "NONFINITE_POLICIES",
    "PARALLEL_MODES",
    "RESUMABLE_FIELDS",
    "RUN_FILE",
    "SAVED_DEFAULTS",
    "OptionError",
    "TrainConfig",
    "as_typed",
    "option_name",
    "read_run_file",
    "run_file_payload",
    "typed",
]

RUN_FILE = "train.json"
NONFINITE_POLICIES = ("stop", "skip")
PARALLEL_MODES = ("ddp", "fsdp")
_RUN_FILE_VERSION = 1

_Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]

_OPTIONS = {
    "n_layer": "--layers",
    "n_head": "--heads",
    "warmup_steps": "--warmup",
    "schedule_params": "--schedule-param",
}
"""The :class:`TrainConfig` fields whose option is not ``--`` plus the field's name."""


def option_name(field: str) -> str:
    """The ``optiplug train`` option that sets ``field``: ``n_layer`` -> ``--layers``.

    Args:
        field: a :class:`TrainConfig` field.

    Returns:
        The option, as typed on the command line.
    """
    return _OPTIONS.get(field, "--" + field.replace("_", "-"))


def typed(value: Any) -> str:
    """``value`` as it is typed on the command line: ``0.01``, ``-1``, ``'my dir'``.

    Args:
        value: an option's parsed value.

    Returns:
        Floats without a needless ``.0``, strings quoted for a shell when needed.
    """
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value or math.isnan(value) else repr(value)
    if isinstance(value, str):
        return shlex.quote(value)
    return str(value)


def as_typed(field: str, value: Any) -> str:
    """The option that gives ``field`` the value ``value``: ``--layers 2``.

    Args:
        field: a :class:`TrainConfig` field.
        value: its value (``schedule_params``: ``(key, value)`` pairs).

    Returns:
        The option and its value; one ``--schedule-param KEY=VALUE`` per pair.
    """
    option = option_name(field)
    if field == "schedule_params":
        return " ".join(f"{option} {typed(f'{key}={item}')}" for key, item in value)
    return f"{option} {typed(value)}"


class OptionError(HyperparameterError):
    """An ``optiplug train`` option's value is invalid; the message names the option as typed.

    The message reads ``--heads 3 must divide --d-model 32`` (a reason that
    starts with a colon follows the value directly: ``--compare adamw=-1: ...``).

    Attributes:
        option: the option (``--heads``); ``field`` stays the
            :class:`TrainConfig` field (``n_head``).
    """

    def __init__(self, field: str, value: Any, reason: str, *, algorithm: str = "train") -> None:
        super().__init__(field, value, reason, algorithm=algorithm)
        self.option = option_name(field)
        separator = "" if reason.startswith(":") else " "
        self.message = f"{as_typed(field, value)}{separator}{reason}"
        self.args = (self.message,)


def _at_least(minimum: int) -> _Validator:
    def check(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise OptionError(attribute.name, value, f"must be an integer >= {minimum}")

    return check


def _optional(minimum: int) -> _Validator:
    check = _at_least(minimum)

    def optional(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check(instance, attribute, value)

    return optional


def _check_lr(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
        raise OptionError(attribute.name, value, "must be a number > 0")


def _check_clip(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
    ):
        raise OptionError(attribute.name, value, "must be a finite number > 0")


def _check_temperature(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise OptionError(attribute.name, value, "must be a finite number >= 0 (0 = greedy)")


def _check_policy(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in NONFINITE_POLICIES:
        raise OptionError(attribute.name, value, "must be 'stop' or 'skip'")


def _check_parallel(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in PARALLEL_MODES:
        raise OptionError(attribute.name, value, "must be 'ddp' or 'fsdp'")


def _frozen(value: Any) -> Any:
    """JSON's lists back to tuples (``betas``), so a resumed run's values compare equal."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _params(pairs: Iterable[Iterable[Any]]) -> tuple[tuple[str, Any], ...]:
    """Optimizer hyperparameters as sorted ``(name, value)`` pairs, lists made tuples."""
    return tuple(sorted((str(key), _frozen(value)) for key, value in pairs))


def _pairs(pairs: Iterable[Iterable[Any]]) -> tuple[tuple[str, Any], ...]:
    """``[["decay", "linear"]]`` (as JSON or argparse give it) -> ``(("decay", "linear"),)``."""
    return tuple((str(key), value) for key, value in pairs)


@attrs.frozen
class TrainConfig:
    """Everything that defines one ``optiplug train`` run.

    Attributes:
        steps: optimizer steps in the run (also the schedule's horizon).
        batch_size: windows per optimizer step, over all processes.
        block_size: characters of context per window.
        n_layer: transformer blocks.
        d_model: embedding width.
        n_head: attention heads (must divide ``d_model``).
        optimizer: ``"auto"`` or a registered optimizer name.
        lr: base learning rate; None keeps the optimizer's (or selection's) own.
        impl: force an implementation (``"loop"``, ``"fused"``...); None measures.
        schedule: a registered schedule name.
        schedule_params: extra schedule parameters as ``(key, value)`` pairs.
        warmup_steps: warm-up for schedules that take one; None = ``steps // 20``.
        seed: seeds the weights, the data order and the sample.
        device: where to train.
        data: a text file or directory; None = the standard library.
        max_chars: character budget of the corpus.
        eval_every: steps between validation points; None = ``steps // 10``.
        eval_windows: validation windows per point on the curve.
        sample_chars: characters to generate at the end (0 = none).
        temperature: sampling temperature, finite and >= 0 (0 = greedy).
        prompt: the sample's prompt; None = ``"def "`` when the vocabulary has it.
        save: directory to save to (``checkpoint/`` and ``train.json``), or None.
        save_every: save every N steps too (besides the end), or None.
        resume: directory to resume from, or None.
        stop_at: stop after this step (saving first), keeping the schedule over ``steps``.
        nproc: processes (torch.distributed, gloo); each gets ``batch_size / nproc``.
        threads: torch intra-op threads (per process); None = the CPUs available
            to this process (affinity mask, cgroup quota), divided among the
            processes (see :mod:`optiplug_train.cpus`).
        nonfinite: ``"stop"`` the run on a non-finite loss (keeping the last
            good checkpoint), or ``"skip"`` such batches (``Graph.set_nonfinite_policy``).
        clip: clip the global gradient norm (L2) to this before every step
            (``Graph.set_grad_clip``); None does not clip.
        parallel: ``"ddp"`` (every process holds the whole model) or
            ``"fsdp"`` (``Graph(parallel="fsdp")``: each process holds a shard of
            the parameters, gradients and optimizer state; runs in ``nproc``
            processes, one included).
        optimizer_params: further optimizer hyperparameters as ``(name, value)``
            pairs (``--tune`` stores the tuned recipe here: betas, weight decay,
            every learning rate besides ``lr``).
    """

    steps: int = attrs.field(default=500, validator=_at_least(1))
    batch_size: int = attrs.field(default=32, validator=_at_least(1))
    block_size: int = attrs.field(default=64, validator=_at_least(2))
    n_layer: int = attrs.field(default=3, validator=_at_least(1))
    d_model: int = attrs.field(default=96, validator=_at_least(1))
    n_head: int = attrs.field(default=4, validator=_at_least(1))
    optimizer: str = "adamw"
    lr: float | None = attrs.field(default=None, validator=_check_lr)
    impl: str | None = None
    schedule: str = "cosine"
    schedule_params: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_pairs)
    warmup_steps: int | None = attrs.field(default=None, validator=_optional(0))
    seed: int = 0
    device: str = "cpu"
    data: str | None = None
    max_chars: int = attrs.field(default=1_500_000, validator=_at_least(1))
    eval_every: int | None = attrs.field(default=None, validator=_optional(1))
    eval_windows: int = attrs.field(default=256, validator=_at_least(1))
    sample_chars: int = attrs.field(default=200, validator=_at_least(0))
    temperature: float = attrs.field(default=0.8, validator=_check_temperature)
    prompt: str | None = None
    save: str | None = None
    save_every: int | None = attrs.field(default=None, validator=_optional(1))
    resume: str | None = None
    stop_at: int | None = attrs.field(default=None, validator=_optional(1))
    nproc: int = attrs.field(default=1, validator=_at_least(1))
    threads: int | None = attrs.field(default=None, validator=_optional(1))
    nonfinite: str = attrs.field(default="stop", validator=_check_policy)
    clip: float | None = attrs.field(default=None, validator=_check_clip)
    parallel: str = attrs.field(default="ddp", validator=_check_parallel)
    optimizer_params: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_params)

    def __attrs_post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise OptionError(
                "n_head", self.n_head, f"must divide {as_typed('d_model', self.d_model)}"
            )
        if self.batch_size % self.nproc:
            raise OptionError(
                "batch_size",
                self.batch_size,
                f"must be divisible by {as_typed('nproc', self.nproc)} "
                "(each process takes --batch-size / --nproc windows)",
            )
        if self.nproc > 1 and self.device != "cpu":
            raise OptionError(
                "device", self.device, "cannot be used: --nproc runs gloo processes on the CPU"
            )
        if self.parallel == "fsdp" and self.device != "cpu":
            raise OptionError(
                "device",
                self.device,
                "cannot be used: --parallel fsdp runs gloo processes on the CPU",
            )

    @property
    def warmup(self) -> int:
        """The warm-up steps the schedule gets when it takes ``warmup_steps``."""
        return self.steps // 20 if self.warmup_steps is None else self.warmup_steps

    @property
    def eval_interval(self) -> int:
        """Steps between points of the validation curve."""
        return self.eval_every or max(1, self.steps // 10)

    @property
    def last_step(self) -> int:
        """The step this run stops at: ``stop_at`` when given (and earlier), else ``steps``."""
        return min(self.steps, self.stop_at or self.steps)


RESUMABLE_FIELDS = (
    "batch_size",
    "block_size",
    "n_layer",
    "d_model",
    "n_head",
    "optimizer",
    "lr",
    "impl",
    "schedule",
    "schedule_params",
    "warmup_steps",
    "seed",
    "data",
    "max_chars",
    "nproc",
    "clip",
    "optimizer_params",
)
"""Options a resumed run takes from ``train.json`` and may not change."""

ADDED_FIELDS: dict[str, Any] = {"clip": None, "optimizer_params": ()}
"""Resumable options newer than the run file format: a ``train.json`` written
before they existed lacks them and ran with these values."""

SAVED_DEFAULTS = ("threads", "save_every", "nonfinite", "parallel")
"""Options a resumed run takes from ``train.json`` unless given (the thread count
changes the order of float sums, so keeping it keeps a resumed run bit-identical)."""


def run_file_payload(config: TrainConfig, vocab: str, step: int) -> dict[str, Any]:
    """The content of ``train.json`` for a run saved at ``step``.

    Args:
        config: the run.
        vocab: the corpus's characters (a resumed run must read the same).
        step: the step the checkpoint holds.

    Returns:
        ``{"format", "step", "steps", "options", "vocab"}``, JSON-ready.
    """
    options = {name: getattr(config, name) for name in RESUMABLE_FIELDS + SAVED_DEFAULTS}
    options["schedule_params"] = [list(pair) for pair in config.schedule_params]
    return {
        "format": _RUN_FILE_VERSION,
        "step": step,
        "steps": config.steps,
        "options": options,
        "vocab": vocab,
    }


def read_run_file(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``train.json`` a saved run left in ``directory``, checked.

    Args:
        directory: a directory written by ``optiplug train --save``.

    Returns:
        ``{"format", "step", "steps", "options", "vocab"}``; ``options`` holds
        every run-defining field and no unknown one.

    Raises:
        OptiplugError: no readable ``train.json`` (not a directory written by
            ``--save``), or one that lacks a key (naming the file and the key).
    """
    path = Path(directory) / RUN_FILE
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise OptiplugError(
            f"--resume {str(directory)!r}: not a directory saved by `optiplug train --save` "
            f"({path.name}: {error})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != _RUN_FILE_VERSION:
        raise OptiplugError(f"--resume {str(directory)!r}: unknown {RUN_FILE} format")
    _check_run_file(payload, path)
    return payload


_RUN_FILE_KEYS: dict[str, type] = {"steps": int, "options": dict, "vocab": str}


def _check_run_file(payload: dict[str, Any], path: Path) -> None:
    """Refuse a ``train.json`` missing a key, or with options a run cannot take."""
    for key, kind in _RUN_FILE_KEYS.items():
        if not isinstance(payload.get(key), kind):
            found = "is missing" if key not in payload else f"is not a {kind.__name__}"
            raise OptiplugError(f"--resume: {path}: key {key!r} {found}; the file is damaged")
    options = payload["options"]
    for name, value in ADDED_FIELDS.items():
        options.setdefault(name, value)
    missing = [name for name in RESUMABLE_FIELDS if name not in options]
    unknown = sorted(set(options) - set(RESUMABLE_FIELDS) - set(SAVED_DEFAULTS))
    if missing or unknown:
        what = f"lacks {', '.join(map(repr, missing))}" if missing else f"has unknown {unknown}"
        raise OptiplugError(f"--resume: {path}: key 'options' {what}; the file is damaged")
    pairs = options["schedule_params"]
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise OptiplugError(
            f"--resume: {path}: options.schedule_params is not a list of [key, value] pairs"
        )
