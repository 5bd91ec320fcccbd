"""The bridged optimizers of ``torch.optim`` 2.13: a static table (no torch import).

Written from the installed classes (``inspect.signature`` for the keywords and
defaults, each constructor's own range checks for the rules, the state each
keeps when stepped) and checked against them by the bridge's tests, so a
torch release that changes a signature fails them. ``foreach``, ``fused``,
``capturable`` and ``differentiable`` are not hyperparameters here: the first
two are spellings of ``impl`` and optiplug refuses the other two set True
(see ``docs/bridges/torch.md``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["ENTRIES", "LIBRARY", "VERSION", "Entry", "Param", "Slot"]

LIBRARY = "torch"
VERSION = "2.13"
"""The torch release whose signatures the table holds (any 2.13.x)."""


class Param(NamedTuple):
    """One keyword of a torch class: its name, torch's default and the rule checking it.

    ``rule`` names an entry of :data:`optiplug_torch.config.RULES`;
    ``source`` is ``"torch"`` where the class checks the keyword itself
    (the rule may be stricter: a finite ``lr``) and ``"optiplug"`` where only
    the bridge does (torch's ASGD takes any ``lambd``).
    """

    name: str
    default: Any
    rule: str
    source: str = "torch"


class Slot(NamedTuple):
    """One per-parameter state entry the class keeps (see :class:`optiplug.StateSlot`)."""

    name: str
    shape: str = "param"
    dtype: str = "param"
    when: str | None = None
    kind: str = "tensor"
    optional: bool = False
    constraints: tuple[str, ...] = ("finite",)


class Entry(NamedTuple):
    """One bridged ``torch.optim`` class.

    Attributes:
        name: the registered name (``torch:<name>``).
        class_name: the class in ``torch.optim``.
        params: its keywords, in signature order.
        summary: one line for ``optiplug list``.
        paper: the paper torch's documentation cites.
        flags: the kernel flags its signature names (``foreach``, ``fused``).
        fused_devices: the device types its fused kernel runs on.
        slots: the per-parameter state, or None (not described).
        closure: its ``step`` needs a closure.
        sparse: it takes sparse gradients only.
        matrices: it takes 2-D parameters only.
        limitation: why optiplug's generic checks cannot run it ("" when they can).
        deviations: ``(check, why)`` for single generic checks it departs from.
        example_hparams: keywords the generic checks use.
    """

    name: str
    class_name: str
    params: tuple[Param, ...]
    summary: str
    paper: str = ""
    flags: tuple[str, ...] = ("foreach",)
    fused_devices: tuple[str, ...] = ()
    slots: tuple[Slot, ...] | None = None
    closure: bool = False
    sparse: bool = False
    matrices: bool = False
    limitation: str = ""
    deviations: tuple[tuple[str, str], ...] = ()
    example_hparams: dict[str, Any] = {}  # noqa: RUF012  # a NamedTuple default, never mutated


_STEP = Slot("step", shape="scalar", dtype="float")
"""torch's step counter: a 0-d tensor of torch's default dtype (float32 for fused kernels)."""

_LBFGS_SLOTS = tuple(
    Slot(name, shape=shape, dtype=dtype, kind=kind, optional=True, constraints=constraints)
    for name, shape, dtype, kind, constraints in (
        ("func_evals", "any", "any", "number", ("integral",)),
        ("n_iter", "any", "any", "number", ("integral",)),
        ("d", "any", "param", "tensor", ("finite",)),
        ("t", "any", "any", "any", ()),
        ("old_dirs", "any", "param", "tensors", ("finite",)),
        ("old_stps", "any", "param", "tensors", ("finite",)),
        ("ro", "any", "param", "tensors", ()),
        ("H_diag", "any", "any", "any", ()),
        ("prev_flat_grad", "any", "param", "tensor", ("finite",)),
        ("prev_loss", "any", "any", "any", ()),
        ("al", "any", "any", "any", ()),
    )
)
"""L-BFGS keeps its state under the first parameter only (flat vectors over every parameter,
its history as lists of them; ``t`` and ``H_diag`` are numbers or 0-d tensors)."""

ENTRIES: tuple[Entry, ...] = (
    Entry(
        name="adagrad",
        class_name="Adagrad",
        params=(
            Param("lr", 0.01, "lr"),
            Param("lr_decay", 0, "non_negative"),
            Param("weight_decay", 0, "non_negative"),
            Param("initial_accumulator_value", 0, "non_negative"),
            Param("eps", 1e-10, "positive", "optiplug"),
            Param("maximize", False, "bool"),
        ),
        summary="Adagrad: per-coordinate steps scaled by the accumulated squared gradients",
        paper="http://jmlr.org/papers/v12/duchi11a.html",
        flags=("foreach", "fused"),
        fused_devices=("cpu", "cuda"),
        deviations=(
            (
                "check_no_grad_step_is_noop",
                "torch's Adagrad creates its state (the step and the sum at "
                "initial_accumulator_value) in its constructor, before any step",
            ),
        ),
        slots=(_STEP, Slot("sum", constraints=("finite", "non_negative"))),
    ),
    Entry(
        name="adadelta",
        class_name="Adadelta",
        params=(
            Param("lr", 1.0, "lr"),
            Param("rho", 0.9, "closed_unit"),
            Param("eps", 1e-06, "positive", "optiplug"),
            Param("weight_decay", 0, "non_negative"),
            Param("maximize", False, "bool"),
        ),
        summary="Adadelta: Adagrad's steps with running averages of squared gradients and updates",
        paper="https://arxiv.org/abs/1212.5701",
        slots=(_STEP, Slot("square_avg"), Slot("acc_delta")),
    ),
    Entry(
        name="adamax",
        class_name="Adamax",
        params=(
            Param("lr", 0.002, "lr"),
            Param("betas", (0.9, 0.999), "betas"),
            Param("eps", 1e-08, "positive", "optiplug"),
            Param("weight_decay", 0, "non_negative"),
            Param("maximize", False, "bool"),
        ),
        summary="Adamax: Adam with the infinity norm of past gradients as its denominator",
        paper="https://arxiv.org/abs/1412.6980",
        slots=(_STEP, Slot("exp_avg"), Slot("exp_inf")),
    ),
    Entry(
        name="asgd",
        class_name="ASGD",
        params=(
            Param("lr", 0.01, "lr"),
            Param("lambd", 0.0001, "non_negative", "optiplug"),
            Param("alpha", 0.75, "non_negative", "optiplug"),
            Param("t0", 1000000.0, "non_negative", "optiplug"),
            Param("weight_decay", 0, "non_negative"),
            Param("maximize", False, "bool"),
        ),
        summary="Averaged SGD: SGD with a decaying step and a running average of the iterates",
        paper="https://dl.acm.org/citation.cfm?id=131098",
        slots=(
            _STEP,
            Slot("eta", shape="scalar", dtype="float"),
            Slot("mu", shape="scalar", dtype="float"),
            Slot("ax"),
        ),
    ),
    Entry(
        name="lbfgs",
        class_name="LBFGS",
        params=(
            Param("lr", 1, "lr"),
            Param("max_iter", 20, "positive_int"),
            Param("max_eval", None, "optional_positive_int"),
            Param("tolerance_grad", 1e-07, "non_negative", "optiplug"),
            Param("tolerance_change", 1e-09, "non_negative", "optiplug"),
            Param("history_size", 100, "positive_int", "optiplug"),
            Param("line_search_fn", None, "line_search"),
        ),
        summary="L-BFGS: quasi-Newton steps from a limited history, each step calling its closure",
        paper="https://doi.org/10.1007/BF01589116",
        flags=(),
        slots=_LBFGS_SLOTS,
        closure=True,
    ),
    Entry(
        name="nadam",
        class_name="NAdam",
        params=(
            Param("lr", 0.002, "lr"),
            Param("betas", (0.9, 0.999), "betas"),
            Param("eps", 1e-08, "positive", "optiplug"),
            Param("weight_decay", 0, "non_negative"),
            Param("momentum_decay", 0.004, "non_negative"),
            Param("decoupled_weight_decay", False, "bool"),
            Param("maximize", False, "bool"),
        ),
        summary="NAdam: Adam with Nesterov momentum and a momentum warm-up schedule",
        paper="https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ",
        slots=(
            _STEP,
            Slot("mu_product", shape="scalar", dtype="float"),
            Slot("exp_avg"),
            Slot("exp_avg_sq", constraints=("finite", "non_negative")),
        ),
    ),
    Entry(
        name="radam",
        class_name="RAdam",
        params=(
            Param("lr", 0.001, "lr"),
            Param("betas", (0.9, 0.999), "betas"),
            Param("eps", 1e-08, "positive", "optiplug"),
            Param("weight_decay", 0, "non_negative"),
            Param("decoupled_weight_decay", False, "bool"),
            Param("maximize", False, "bool"),
        ),
        summary="RAdam: Adam with its adaptive step rectified while the variance estimate is poor",
        paper="https://arxiv.org/abs/1908.03265",
        slots=(_STEP, Slot("exp_avg"), Slot("exp_avg_sq", constraints=("finite", "non_negative"))),
    ),
    Entry(
        name="rmsprop",
        class_name="RMSprop",
        params=(
            Param("lr", 0.01, "lr"),
            Param("alpha", 0.99, "non_negative"),
            Param("eps", 1e-08, "positive", "optiplug"),
            Param("weight_decay", 0, "non_negative"),
            Param("momentum", 0, "momentum", "optiplug"),
            Param("centered", False, "bool"),
            Param("maximize", False, "bool"),
        ),
        summary="RMSprop: steps scaled by a running average of squared gradients",
        paper="https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf",
        slots=(
            _STEP,
            Slot("square_avg", constraints=("finite", "non_negative")),
            Slot("momentum_buffer", when="momentum"),
            Slot("grad_avg", when="centered"),
        ),
    ),
    Entry(
        name="rprop",
        class_name="Rprop",
        params=(
            Param("lr", 0.01, "lr"),
            Param("etas", (0.5, 1.2), "etas"),
            Param("step_sizes", (1e-06, 50), "step_sizes", "optiplug"),
            Param("maximize", False, "bool"),
        ),
        summary="Rprop: per-coordinate step sizes grown or shrunk by the gradient's sign",
        paper="https://doi.org/10.1109/ICNN.1993.298623",
        slots=(_STEP, Slot("prev"), Slot("step_size", constraints=("finite", "non_negative"))),
    ),
    Entry(
        name="sparse_adam",
        class_name="SparseAdam",
        params=(
            Param("lr", 0.001, "positive_lr"),
            Param("betas", (0.9, 0.999), "betas"),
            Param("eps", 1e-08, "positive"),
            Param("maximize", False, "bool"),
        ),
        summary="SparseAdam: Adam's moments updated only where a sparse gradient has entries",
        paper="https://arxiv.org/abs/1412.6980",
        flags=(),
        slots=(
            Slot("step", shape="scalar", dtype="any", kind="number", constraints=("integral",)),
            Slot("exp_avg"),
            Slot("exp_avg_sq", constraints=("finite", "non_negative")),
        ),
        sparse=True,
        limitation="takes sparse gradients only (an nn.Embedding(sparse=True)); the generic "
        "conformance checks give dense gradients",
    ),
    Entry(
        name="adafactor",
        class_name="Adafactor",
        params=(
            Param("lr", 0.01, "lr"),
            Param("beta2_decay", -0.8, "non_positive"),
            Param("eps", (None, 0.001), "adafactor_eps"),
            Param("d", 1.0, "at_least_one"),
            Param("weight_decay", 0.0, "non_negative"),
            Param("maximize", False, "bool"),
        ),
        summary="Adafactor: a factored second moment (row and column averages for matrices)",
        paper="https://arxiv.org/abs/1804.04235",
        slots=(
            _STEP,
            Slot("row_var", shape="any", optional=True),
            Slot("col_var", shape="any", optional=True),
            Slot("variance", optional=True),
        ),
    ),
    Entry(
        name="muon",
        class_name="Muon",
        params=(
            Param("lr", 0.001, "lr"),
            Param("weight_decay", 0.1, "non_negative"),
            Param("momentum", 0.95, "momentum", "optiplug"),
            Param("nesterov", True, "bool"),
            Param("ns_coefficients", (3.4445, -4.775, 2.0315), "ns_coefficients"),
            Param("eps", 1e-07, "positive", "optiplug"),
            Param("ns_steps", 5, "ns_steps"),
            Param("adjust_lr_fn", None, "adjust_lr_fn"),
        ),
        summary="Muon: momentum orthogonalised by Newton-Schulz iterations, for 2-D parameters",
        paper="https://kellerjordan.github.io/posts/muon/",
        flags=(),
        slots=(Slot("momentum_buffer"),),
        matrices=True,
        limitation="takes 2-D parameters only (torch's Muon has no AdamW for the rest); the "
        "generic conformance checks' model holds vectors",
    ),
)
"""Every bridged class, by registered name."""
