"""The optimizers of ``schedulefree`` as a static table (torch-free, schedulefree-free).

Written from the installed schedulefree (class signatures and defaults, the
preprint its documentation cites; eleven classes do not call for a
generator). Value ranges (``check``) follow the library's own argument
checks and docstrings, tightened where a value it accepts breaks it:
``beta1`` (or ``momentum``) of 0 divides by zero in ``eval()``, which moves
the parameters to ``y + (1 - 1/beta1) (z - y)``; an ``eps`` of 0 divides
zero by zero where a gradient element is 0. A test compares this table with
the installed classes, so an upgrade that changes a signature or a default
fails loudly.
"""

from __future__ import annotations

from typing import Any

import attrs

from optiplug import StateSlot

__all__ = ["CATALOG", "LIBRARY", "LIBRARY_VERSION", "PAPER", "Entry", "Param", "entry"]

LIBRARY = "schedulefree"
LIBRARY_VERSION = "1.4.1"
"""The schedulefree release this table was written from and tested against."""

PAPER = "https://arxiv.org/abs/2405.15682"
"""Defazio et al., 2024, "The Road Less Scheduled", which the library cites for every method."""


@attrs.frozen
class Param:
    """One constructor keyword of a library class.

    Attributes:
        name: the keyword.
        default: its default in the class signature.
        check: the range, a key of :data:`optiplug_schedulefree.config.CHECKS`.
    """

    name: str
    default: Any
    check: str


@attrs.frozen
class Entry:
    """One bridged class.

    Attributes:
        name: the registered name: the library's own module name for the class.
        cls: the class name in ``schedulefree``.
        module: the module defining it.
        params: its constructor keywords in signature order, ``params`` excluded;
            ``foreach`` is left out (``impl=`` chooses it).
        implementations: ``"loop"``/``"foreach"`` when the class honours its
            ``foreach`` flag; empty when it has one step.
        state: the per-parameter state it keeps.
        group_state: param-group keys holding running state.
        train_eval: it needs ``train()`` before steps and ``eval()`` before
            evaluation and checkpoints.
        description: one paragraph for ``optiplug show``.
        step_closure: ``step`` needs a closure (the closure forms, which
            evaluate the gradient at the interpolated point themselves).
        limitation: why it cannot pass optiplug's checks ("" if it can).
        example_hparams: keywords the conformance checks add.
    """

    name: str
    cls: str
    module: str
    params: tuple[Param, ...]
    implementations: tuple[str, ...]
    state: tuple[StateSlot, ...]
    group_state: tuple[str, ...]
    train_eval: bool
    description: str
    step_closure: bool = False
    limitation: str = ""
    example_hparams: dict[str, Any] = attrs.field(factory=dict)

    @property
    def target(self) -> str:
        """``"module:Class"`` of the library class."""
        return f"{self.module}:{self.cls}"


_Z = StateSlot("z", description="the base sequence z (the SGD/Adam iterate being averaged)")
_V = StateSlot(
    "exp_avg_sq",
    constraints=("finite", "non_negative"),
    description="second moment (EMA of squared gradients, decay beta2)",
)
_X = StateSlot("x", description="the averaged iterate x (the evaluation point)")
_Y = StateSlot("y", description="the interpolated iterate y (the gradient point)")

_RUNNING = ("k", "weight_sum", "lr_max", "scheduled_lr")
_TRAIN = ("k", "train_mode", "weight_sum", "lr_max", "scheduled_lr")

_WRAPPER = (
    "wraps an optimizer object (Wrapper(base, ...)), not parameters; it is no "
    "torch.optim.Optimizer and keeps its mode outside state_dict(): build the base with "
    "optiplug.create, then wrap it"
)
_TRAIN_EVAL = (
    "Needs optimizer.train() before training steps and optimizer.eval() before "
    "evaluation and checkpoints."
)


def _adam(warmup: bool = True) -> list[Param]:
    head = [Param("lr", 0.0025, "lr"), Param("betas", (0.9, 0.999), "betas")]
    head += [Param("eps", 1e-8, "eps"), Param("weight_decay", 0, "non_negative")]
    if warmup:
        head.append(Param("warmup_steps", 0, "non_negative_int"))
    return head


def _weights(r: float | int = 0.0, power: float | int = 2.0) -> list[Param]:
    return [Param("r", r, "finite"), Param("weight_lr_power", power, "non_negative")]


_SILENT = Param("silent_sgd_phase", True, "bool")


def _sgd(order: tuple[str, ...], power: float | int) -> tuple[Param, ...]:
    known = {
        "lr": Param("lr", 1.0, "lr"),
        "momentum": Param("momentum", 0.9, "open_unit"),
        "weight_decay": Param("weight_decay", 0, "non_negative"),
        "warmup_steps": Param("warmup_steps", 0, "non_negative_int"),
        "r": Param("r", 0.0, "finite"),
        "weight_lr_power": Param("weight_lr_power", power, "non_negative"),
    }
    return tuple(known[name] for name in order)


_SGD_ORDER = ("lr", "momentum", "weight_decay", "warmup_steps", "r", "weight_lr_power")
_SGD_CLOSURE_ORDER = ("lr", "weight_decay", "momentum", "warmup_steps", "r", "weight_lr_power")


CATALOG: tuple[Entry, ...] = (
    Entry(
        name="adamw_schedulefree",
        cls="AdamWScheduleFree",
        module="schedulefree.adamw_schedulefree",
        params=(*_adam(), *_weights()),
        implementations=("loop", "foreach"),
        state=(_Z, _V),
        group_state=_TRAIN,
        train_eval=True,
        description="Schedule-Free AdamW: no learning-rate schedule; the parameters are "
        f"an average of the Adam iterates. {_TRAIN_EVAL}",
    ),
    Entry(
        name="adamw_schedulefree_closure",
        cls="AdamWScheduleFreeClosure",
        module="schedulefree.adamw_schedulefree_closure",
        params=(*_adam(), *_weights(r=0)),
        implementations=("loop", "foreach"),
        state=(_Z, _V),
        group_state=_RUNNING,
        train_eval=False,
        description="Schedule-Free AdamW, closure form: step(closure) evaluates the "
        "gradient at the interpolated point, so no train()/eval() is needed.",
        step_closure=True,
    ),
    Entry(
        name="adamw_schedulefree_paper",
        cls="AdamWScheduleFreePaper",
        module="schedulefree.adamw_schedulefree_paper",
        params=(*_adam(), *_weights()),
        implementations=("loop", "foreach"),
        state=(_Z, _V),
        group_state=_TRAIN,
        train_eval=True,
        description="Schedule-Free AdamW exactly as the paper states it (weight decay and "
        f"bias correction as published). {_TRAIN_EVAL}",
    ),
    Entry(
        name="adamw_schedulefree_reference",
        cls="AdamWScheduleFreeReference",
        module="schedulefree.adamw_schedulefree_reference",
        params=(*_adam(), *_weights(r=0, power=2), Param("decay_at_z", False, "bool")),
        implementations=(),
        state=(_Z, _V, _X, _Y),
        group_state=_TRAIN,
        train_eval=True,
        description="Schedule-Free AdamW, reference form: keeps x, y and z explicitly "
        f"(twice the state of adamw_schedulefree). {_TRAIN_EVAL}",
    ),
    Entry(
        name="radam_schedulefree",
        cls="RAdamScheduleFree",
        module="schedulefree.radam_schedulefree",
        params=(*_adam(warmup=False), *_weights(), _SILENT),
        implementations=("loop", "foreach"),
        state=(_Z, _V),
        group_state=_TRAIN,
        train_eval=True,
        description="Schedule-Free RAdam: RAdam's rectification replaces warmup. " + _TRAIN_EVAL,
        # the rectification keeps the step small for ~1/(1 - beta2) steps: with
        # beta2 = 0.99 the 200-step quadratic check reaches the Adam regime
        example_hparams={"betas": (0.9, 0.99)},
    ),
    Entry(
        name="radam_schedulefree_closure",
        cls="RAdamScheduleFreeClosure",
        module="schedulefree.radam_schedulefree_closure",
        params=(*_adam(warmup=False), *_weights(r=0), _SILENT),
        implementations=("loop", "foreach"),
        state=(_Z, _V),
        group_state=_RUNNING,
        train_eval=False,
        description="Schedule-Free RAdam, closure form.",
        step_closure=True,
        example_hparams={"betas": (0.9, 0.99)},  # as radam_schedulefree's, for the same reason
    ),
    Entry(
        name="sgd_schedulefree",
        cls="SGDScheduleFree",
        module="schedulefree.sgd_schedulefree",
        params=_sgd(_SGD_ORDER, 2),
        implementations=("loop", "foreach"),
        state=(_Z,),
        group_state=_TRAIN,
        train_eval=True,
        description=f"Schedule-Free SGD with momentum-style interpolation. {_TRAIN_EVAL}",
    ),
    Entry(
        name="sgd_schedulefree_closure",
        cls="SGDScheduleFreeClosure",
        module="schedulefree.sgd_schedulefree_closure",
        params=_sgd(_SGD_CLOSURE_ORDER, 2.0),
        implementations=("loop", "foreach"),
        state=(_Z,),
        group_state=_RUNNING,
        train_eval=False,
        description="Schedule-Free SGD, closure form.",
        step_closure=True,
    ),
    Entry(
        name="sgd_schedulefree_reference",
        cls="SGDScheduleFreeReference",
        module="schedulefree.sgd_schedulefree_reference",
        params=_sgd(_SGD_ORDER, 2),
        implementations=(),
        state=(_Z, _X, _Y),
        group_state=_TRAIN,
        train_eval=True,
        description=f"Schedule-Free SGD, reference form (x, y and z kept). {_TRAIN_EVAL}",
    ),
    Entry(
        name="schedulefree_wrapper",
        cls="ScheduleFreeWrapper",
        module="schedulefree.wrap_schedulefree",
        params=(
            Param("weight_decay_at_y", 0.0, "non_negative"),
            Param("momentum", 0.9, "open_unit"),
            Param("weight_lr_power", 2, "non_negative"),
            Param("r", 0, "finite"),
        ),
        implementations=(),
        state=(_Z,),
        group_state=("k", "weight_sum", "lr_max"),
        train_eval=True,
        description="Makes any optimizer schedule-free (memory-efficient swap form).",
        limitation=_WRAPPER,
    ),
    Entry(
        name="schedulefree_wrapper_reference",
        cls="ScheduleFreeWrapperReference",
        module="schedulefree.wrap_schedulefree_reference",
        params=(
            Param("momentum", 0.9, "open_unit"),
            Param("weight_decay_at_y", 0.0, "non_negative"),
            Param("r", 0, "finite"),
            Param("weight_lr_power", 2, "non_negative"),
        ),
        implementations=(),
        state=(_Z, _X, _Y),
        group_state=("k", "weight_sum", "lr_max"),
        train_eval=True,
        description="Makes any optimizer schedule-free (reference form, x, y, z kept).",
        limitation=_WRAPPER,
    ),
)
"""Every optimizer class ``schedulefree`` exports."""


def entry(name: str) -> Entry:
    """The catalogue entry registered as ``name``.

    Raises:
        KeyError: no such entry.
    """
    for item in CATALOG:
        if item.name == name:
            return item
    raise KeyError(name)
