"""Learning-rate schedules: pure, picklable functions of the optimizer step.

A schedule maps the optimizer step ``s`` (an int >= 0) to a **multiplier** of
each param group's base lr::

    applied lr = base_lr(group) * schedule(s) * lr_scale

Every schedule is a frozen, slotted attrs class: it has no mutable state,
pickles, compares by value, and round-trips through a plain dict
(``optiplug.schedule(**s.to_dict()) == s``). Parameters are validated at
construction. Past its end a schedule stays at its final value.

Warm-up convention: step ``s`` of a warm-up of ``W`` steps uses
``start + (1 - start) * (s + 1) / W``, so the first update never has lr 0
(Hugging Face uses ``s / W``; ours equals theirs shifted by one step).

This module does not import torch at import time; :meth:`Schedule.as_torch`
and :meth:`Schedule.apply` import it when called.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from .fields import invalid, is_int, is_real
from .groups import initial_lrs, set_lr

if TYPE_CHECKING:
    import torch


__all__ = ["Schedule"]


def _plain(value: Any) -> Any:
    """Turn a field value into plain data (nested schedules into dicts, tuples into lists)."""
    if isinstance(value, Schedule):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def _format_rows(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


@attrs.frozen
class Schedule:
    """Base class of learning-rate schedules: ``schedule(step) -> multiplier``.

    Subclasses are frozen attrs classes declaring their parameters as fields,
    a ``name`` (what users type), a ``formula`` (shown by ``optiplug show``)
    and :meth:`value_at`. Everything else (validation of the step,
    :meth:`to_dict`, :meth:`as_torch`, :meth:`apply`, :meth:`describe`) is
    provided here. Third-party schedules subclass it and register through the
    ``optiplug_schedules`` hook.
    """

    name: ClassVar[str] = ""
    formula: ClassVar[str] = ""

    def __call__(self, step: int) -> float:
        """Return the lr multiplier at optimizer step ``step``.

        Args:
            step: the optimizer step, an integer >= 0 (the first update is step 0).

        Returns:
            A finite float >= 0 for the built-in schedules.

        Raises:
            HyperparameterError: ``step`` is not an integer >= 0.
        """
        if not is_int(step) or step < 0:
            raise invalid(self, "step", step, "must be an integer >= 0")
        return float(self.value_at(int(step)))

    def value_at(self, step: int) -> float:
        """Compute the multiplier at a validated ``step``; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement value_at()")

    def key_steps(self) -> dict[int, str]:
        """Steps where a phase begins, labelled (for tables and plots); may be empty."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """Return the schedule as plain data, ``name`` included.

        Returns:
            A dict such that ``optiplug.schedule(**d) == self``; nested
            schedules become dicts and tuples become lists (JSON-friendly).
        """
        fields = {f.name: _plain(getattr(self, f.name)) for f in attrs.fields(type(self))}
        return {"name": self.name, **fields}

    def __repr__(self) -> str:
        values = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in attrs.fields(type(self)) if f.repr
        )
        return f"optiplug.schedule({self.name!r}{', ' if values else ''}{values})"

    @classmethod
    def describe(cls) -> str:
        """Return the formula and a table of the parameters (``optiplug show``)."""
        lines = ["formula (s = optimizer step, starting at 0):"]
        lines += ["  " + line for line in inspect.cleandoc(cls.formula or "-").splitlines()]
        lines += ["", "parameters:"]
        fields = attrs.fields(cls)
        if not fields:
            lines.append("  (none)")
        else:
            rows = [["name", "default", "constraint", "meaning"]]
            rows += [
                [
                    f.name,
                    "required" if f.default is attrs.NOTHING else repr(f.default),
                    f.metadata.get("constraint", "-"),
                    f.metadata.get("help", ""),
                ]
                for f in fields
            ]
            lines += _format_rows(rows)
        lines += ["", "Past its end the schedule stays at its final value."]
        return "\n".join(lines)

    def apply(
        self,
        optimizer: Any,
        step: int,
        base_lrs: Sequence[float] | None = None,
        scale: float = 1.0,
    ) -> list[float]:
        """Set each param group's lr to ``base * self(step) * scale``.

        A group whose lr is a tensor is updated in place (``lr.fill_``), so a
        ``torch.compile``-d step that reads it does not recompile.

        Args:
            optimizer: a ``torch.optim.Optimizer`` (anything with ``param_groups``).
            step: the optimizer step (int >= 0).
            base_lrs: one base lr per group; None uses each group's
                ``initial_lr``, recording the current lr there on first use
                (as torch's schedulers do).
            scale: a further factor, e.g. linear scaling with the world size.

        Returns:
            The lr set on each group, as floats.

        Raises:
            HyperparameterError: a bad step, a negative or non-finite scale,
                or a ``base_lrs`` of the wrong length.
        """
        if not is_real(scale) or scale < 0:
            raise invalid(self, "scale", scale, "must be a finite number >= 0")
        factor = self(step) * float(scale)
        groups = optimizer.param_groups
        bases = initial_lrs(groups) if base_lrs is None else list(base_lrs)
        if len(bases) != len(groups):
            raise invalid(self, "base_lrs", base_lrs, f"must have one lr per group ({len(groups)})")
        values = [float(base) * factor for base in bases]
        for group, value in zip(groups, values, strict=True):
            set_lr(group, value)
        return values

    def as_torch(self, optimizer: torch.optim.Optimizer, last_epoch: int = -1) -> Any:
        """Wrap this schedule as a ``torch.optim.lr_scheduler.LRScheduler``.

        The result works wherever a torch scheduler does (plain loops,
        Lightning, HF ``Trainer(optimizers=(opt, sched))``); its
        ``state_dict()`` holds only plain data and it pickles.

        Args:
            optimizer: the optimizer whose groups' lrs it drives; each group's
                base lr is its ``initial_lr`` if present, else its lr now.
            last_epoch: torch's resume index; -1 starts at step 0.

        Returns:
            A :class:`ScheduleLR` (an ``LRScheduler`` subclass).
        """
        from .torch_adapter import ScheduleLR  # deferred: imports torch

        return ScheduleLR(optimizer, self, last_epoch=last_epoch)
