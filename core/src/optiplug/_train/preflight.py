"""Checks ``optiplug train`` makes before it reads the corpus or trains anything.

A mistake that would only show up when the run ends (a ``--save`` directory
that cannot be created, a ``--plot`` path in a missing directory, an
``--impl`` the optimizer lacks, an lr for the third optimizer of a
``--compare``) is refused here, in one line, while nothing has been spent.

Importing this module does not import torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from .._core.registry import Registry
from ..cli.schedule import check_plot_path
from ..errors import HyperparameterError, OptiplugError
from .config import TrainConfig
from .optim import make_schedule

__all__ = ["check_data_path", "check_implementation", "check_output_dir", "preflight"]


def check_output_dir(path: str | os.PathLike[str], option: str = "--save") -> None:
    """Refuse a directory that could not be created or written to.

    The directory itself, or else its nearest existing ancestor, must be a
    writable directory: no component of the path may be a file.

    Args:
        path: the directory a run will save to (it need not exist yet).
        option: the option that named it, for the message.

    Raises:
        OptiplugError: a component of the path is a file, or the directory
            (or the ancestor it would be created in) is not writable.
    """
    shown = str(path)
    target = Path(os.path.abspath(path))
    existing = next((p for p in (target, *target.parents) if os.path.lexists(p)), None)
    if existing is None:  # not even the root: nothing sensible to check
        return
    if not existing.is_dir():
        what = "is a file" if existing == target else f"{str(existing)!r} is a file"
        raise OptiplugError(
            f"{option} {shown!r}: {what}, not a directory; give a directory to save the run in"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == target else f" ({str(existing)!r}, where it would be created)"
        raise OptiplugError(f"{option} {shown!r}: the directory{where} is not writable")


def check_data_path(path: str | None) -> None:
    """Refuse a ``--data`` path that does not exist.

    Args:
        path: the ``--data`` path, or None for the standard library.

    Raises:
        OptiplugError: there is nothing at ``path``.
    """
    if path is not None and not os.path.exists(path):
        raise OptiplugError(f"--data {path!r}: no such file or directory")


def check_implementation(registry: Registry, name: str, impl: str | None) -> None:
    """Refuse an ``--impl`` that optimizer ``name`` does not have.

    Args:
        registry: where the optimizer is registered.
        name: the optimizer.
        impl: the forced implementation, or None (measured: nothing to check).

    Raises:
        HyperparameterError: ``impl`` names none of its implementations (the
            message lists them, as creating the optimizer would).
    """
    if impl is None:
        return
    names = sorted({found.name for found in registry.implementations(name)})
    if impl not in names:
        available = ", ".join(names) or "none registered"
        raise HyperparameterError(
            "impl", impl, f"no such implementation; available: {available}", algorithm=name
        )


def _check_optimizer(config: TrainConfig, registry: Registry, name: str, lr: float | None) -> None:
    run = attrs.evolve(config, optimizer=name, lr=config.lr if lr is None else lr)  # checks lr
    if name == "auto":
        return  # chosen once the model is built; checked then, before the first step
    check_implementation(registry, name, run.impl)
    overrides: dict[str, Any] = {} if run.lr is None else {"lr": run.lr}
    registry.factory(name, impl=run.impl, **overrides)


def preflight(
    config: TrainConfig,
    registry: Registry,
    *,
    optimizers: Sequence[tuple[str, float | None]] = (),
    plot: str | None = None,
) -> None:
    """Check everything that can be checked before the corpus is read or a step is taken.

    Args:
        config: the run.
        registry: where optimizers and schedules are looked up.
        optimizers: ``(name, lr)`` of each optimizer to train (``--compare``);
            empty for one run of ``config.optimizer``.
        plot: the image ``--compare`` will write, or None.

    Raises:
        OptiplugError: an unknown optimizer or schedule, a bad hyperparameter,
            lr or ``--impl``, ``--save-every`` without a save directory, a save
            directory or plot path that could not be written, or a missing
            ``--data``.
    """
    make_schedule(config, registry)
    for name, lr in optimizers or [(config.optimizer, None)]:
        _check_optimizer(config, registry, name, lr)
    if config.save_every is not None and config.save is None:
        raise OptiplugError("--save-every needs --save DIR (or --resume DIR) to save into")
    if config.save is not None:
        option = "--resume" if config.save == config.resume else "--save"
        check_output_dir(config.save, option)
    if plot is not None:
        check_plot_path(plot)
    check_data_path(config.data)
