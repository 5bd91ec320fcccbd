"""The frozen records plugins return from registration hooks."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from .._lazy import LazyCallable
from ..validators import Hyperparameter, hyperparameters_of

if TYPE_CHECKING:
    import torch

__all__ = [
    "Candidate",
    "CommandSpec",
    "ELEMENTWISE",
    "HFName",
    "ImplementationSpec",
    "OptimizerSpec",
    "Origin",
    "PluginInfo",
    "Problem",
    "ProviderInfo",
    "ScheduleSpec",
    "SelectionRequest",
    "StateSlot",
    "summary_of",
]

ELEMENTWISE = "elementwise"
"""The capability tag of an element-wise step (see :attr:`OptimizerSpec.capabilities`)."""

PLUGIN_STATUSES = ("active", "disabled", "unavailable", "failed", "incompatible")


# Typed converters: attrs' plugin reads a converter's parameter type as the
# type ``__init__`` accepts, which the generic builtins (``dict``, ``tuple``,
# ``frozenset``) leave unsolved.
def _to_dict(value: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> dict[str, Any]:
    return dict(value)


def _to_names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _to_tags(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


def _to_implementations(value: Iterable[ImplementationSpec]) -> tuple[ImplementationSpec, ...]:
    return tuple(value)


def _to_shape(value: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(size) for size in value)


def _to_group(value: int | None) -> int:
    return -1 if value is None else value


def summary_of(description: str, obj: Any) -> str:
    """Return the first line of ``description``, else of ``obj``'s docstring."""
    if not description and isinstance(obj, LazyCallable):
        try:
            obj = obj.resolve()
        except Exception:  # a broken target has no docstring; calling it will raise
            return ""
    text = description or inspect.getdoc(obj) or ""
    return text.strip().splitlines()[0] if text.strip() else ""


@attrs.frozen
class ProviderInfo:
    """Which plugin, distribution and version provided a record."""

    plugin: str
    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.plugin} ({self.distribution} {self.version})"


@attrs.frozen
class Origin:
    """Where a bridged algorithm comes from: another library's optimizer class.

    A spec with an origin is *bridged*; one without is the plugin's own
    (*native*). The difference decides names: a native algorithm keeps its
    plain name when a bridge offers the same one (see
    :meth:`optiplug.Registry.spec`).

    Attributes:
        library: the library's distribution name (``"pytorch-optimizer"``).
        version: its version, as the bridge was built against or found.
        target: the class, ``"module:QualName"``.
        paper: the paper or page the library cites for it ("" if none).
        limitation: why it cannot pass optiplug's checks everywhere (needs a
            CUDA device, a closure, no float64 ...); "" when it can. Shown by
            ``optiplug list`` and ``optiplug show``.
    """

    library: str
    version: str = ""
    target: str = ""
    paper: str = ""
    limitation: str = ""


SLOT_KINDS = ("tensor", "number", "tensors", "any")
"""What a :class:`StateSlot` holds: one tensor, a Python number, a list or tuple
of tensors, or anything (kept and copied, never checked)."""


@attrs.frozen
class StateSlot:
    """One per-parameter state entry an algorithm keeps (e.g. ``exp_avg``).

    Attributes:
        name: the key in ``optimizer.state[param]`` (torch's name where torch
            has the algorithm).
        shape: ``"param"`` (same shape as the parameter), ``"scalar"`` or
            ``"any"`` (not checked: a factored or preconditioner state).
        dtype: ``"param"`` (the parameter's dtype), ``"float32"``,
            ``"float"`` (any floating dtype) or ``"any"`` (not checked).
        when: name of a group hyperparameter that must be truthy for the slot
            to exist (``"amsgrad"``, ``"momentum"``); None means always.
        constraints: any of ``"finite"``, ``"non_negative"``, ``"integral"``.
        description: what the slot holds.
        kind: ``"tensor"`` (one tensor; a tensor subclass such as a
            quantized state is one too: its shape and dtype are checked as
            it reports them, its values through the inner tensors of
            ``__tensor_flatten__``), ``"number"`` (a Python int or float),
            ``"tensors"`` (a list or tuple of tensors, each checked against
            ``dtype`` and ``constraints``; ``shape`` is not checked) or
            ``"any"`` (anything; copied on load, never checked).
        optional: the optimizer keeps it for some parameters only (a
            factored second moment for matrices, none for vectors): a state
            that lacks it is fine, one that has it is checked as declared.
    """

    name: str
    shape: str = attrs.field(
        default="param", validator=attrs.validators.in_(("param", "scalar", "any"))
    )
    dtype: str = attrs.field(
        default="param", validator=attrs.validators.in_(("param", "float32", "float", "any"))
    )
    when: str | None = None
    constraints: tuple[str, ...] = ("finite",)
    description: str = ""
    kind: str = attrs.field(default="tensor", validator=attrs.validators.in_(SLOT_KINDS))
    optional: bool = False

    def present_for(self, group: Mapping[str, Any]) -> bool:
        """Whether this slot should exist for a parameter of ``group``."""
        return self.when is None or bool(group.get(self.when))


@attrs.frozen
class ImplementationSpec:
    """One implementation of an algorithm (``loop``, ``foreach``, ``fused``...).

    All implementations of an algorithm share its state layout, so a
    checkpoint moves freely between them.

    Attributes:
        algorithm: the algorithm's canonical name (``"adam"``).
        name: the implementation's name (``"fused"``).
        factory: ``(params, **hparams) -> torch.optim.Optimizer``.
        supports: ``(params) -> bool``; whether it can run these parameters
            (device, dtype, layout). None means everywhere.
        priority: order used when implementations are not chosen by
            measurement (``OPTIPLUG_AUTOTUNE=0``): higher first.
        description: one line for ``optiplug list``/``show``.
        provider: filled in by the registry.
        availability: ``() -> str | None``; None when the implementation can
            run on this machine, else the reason it cannot ("needs a CUDA
            device", "triton is not installed"). None means always available.
        compiles: whether its first steps compile (``torch.compile``, a
            triton kernel): while ``impl=None`` measures in the background,
            the highest-priority implementation that does not compile runs.
    """

    algorithm: str
    name: str
    factory: Callable[..., Any]
    supports: Callable[[Sequence[torch.Tensor]], bool] | None = None
    priority: int = 0
    description: str = ""
    provider: ProviderInfo | None = None
    availability: Callable[[], str | None] | None = None
    compiles: bool = False

    def unavailable_reason(self) -> str | None:
        """Why this implementation cannot run on this machine, or None when it can."""
        return None if self.availability is None else self.availability()

    def can_run(self, params: Sequence[torch.Tensor]) -> bool:
        """Whether this implementation supports ``params`` (device, dtype)."""
        return True if self.supports is None else bool(self.supports(params))


@attrs.frozen
class HFName:
    """A Hugging Face ``TrainingArguments(optim=...)`` name an algorithm serves.

    :mod:`optiplug_integrations.transformers` serves each name by the
    algorithms that declare it (:attr:`OptimizerSpec.hf_names`), the highest
    :attr:`priority` first among those installed.

    Attributes:
        optim: the name (``"adamw_torch_fused"``).
        impl: the implementation it forces, or None to choose.
        caveat: how the algorithm differs from what the name means in
            transformers, warned when it is taken; "" when it is the same.
        priority: among the algorithms declaring ``optim``: higher first
            (a fallback declares a negative one).
        adam_arguments: whether transformers gives this name the Trainer's
            ``adam_beta1``/``adam_beta2``/``adam_epsilon`` (False for
            ``adagrad`` and ``rmsprop``, which it builds with torch's own
            ``eps``): when False they are not passed as ``betas``/``eps``.
            For a :attr:`target_modules` name they go into the target
            group when True (APOLLO), nowhere when False (GaLore).
        target_modules: whether transformers builds this name over
            ``TrainingArguments.optim_target_modules`` (GaLore, APOLLO): the
            target modules' weight matrices in a group carrying the
            projection keys read from ``optim_args``, every other parameter
            in a plain group, and only ``learning_rate`` given to the
            constructor (no weight decay). A missing ``optim_target_modules``
            is a :class:`~optiplug.errors.HyperparameterError`.
        decay_groups: whether transformers steps this name over the Trainer's
            two weight-decay groups even when ``weight_decay`` is 0, and the
            algorithm's step depends on the grouping (GrokAdamW's per-layer
            beta1 decays with a parameter's index in its group).
    """

    STATE_32: ClassVar[str] = (
        "optiplug keeps this optimizer's state in 32 bits, not bitsandbytes' 8-bit state"
    )
    """The caveat of an 8-bit name served with 32-bit state."""
    UNPAGED: ClassVar[str] = "optiplug's state is not paged to host memory"
    """The caveat of a paged name."""

    optim: str
    impl: str | None = None
    caveat: str = ""
    priority: int = 0
    adam_arguments: bool = True
    target_modules: bool = False
    decay_groups: bool = False


def _to_hf_names(value: Iterable[HFName | str]) -> tuple[HFName, ...]:
    return tuple(HFName(item) if isinstance(item, str) else item for item in value)


@attrs.frozen
class OptimizerSpec:
    """An optimizer algorithm a plugin provides.

    Only ``name`` and ``factory`` are required; a torch optimizer class is a
    valid factory.

    Attributes:
        name: canonical name users type (``"adam"``).
        factory: ``(params, **hparams) -> torch.optim.Optimizer``.
        defaults: hyperparameter defaults applied before the user's keywords.
        config: attrs class validating the hyperparameters (see
            :mod:`optiplug.validators`); None validates by signature.
        description: one paragraph; its first line is the summary.
        aliases: other names that resolve to this one (not listed).
        state_slots: per-parameter state layout; None means unknown (generic
            checks only).
        implementations: implementations shipped with the algorithm.
        capabilities: free-form tags (``"matrices"``, ``"sparse"``...). The tag
            ``"uses-registry"`` makes creation pass ``registry=`` (the
            creating registry) to ``factory``, for algorithms built from
            other algorithms; ``"elementwise"`` (:data:`ELEMENTWISE`) declares
            a step that updates each element from that element alone (its
            parameter, gradient and state slots), whose floor ``optiplug
            bench`` measures as a copy of the bytes it moves.
        example_hparams: keywords that make a working example (the
            conformance checks add them, e.g. the required ``routes`` of
            ``multi``).
        provider: filled in by the registry.
        origin: where a bridged algorithm comes from (:class:`Origin`);
            None for the plugin's own.
        group_state: param-group keys that hold the optimizer's running
            state rather than hyperparameters (a step counter kept in the
            group, schedule-free's ``weight_sum`` and ``train_mode``). A
            state dict may carry them or lack them (an optimizer that has
            not stepped); saved ones are loaded as they are, checked only
            to be plain values (numbers, strings, 0-d tensors, tuples of
            those), never validated as hyperparameters nor reported as
            changed.
        train_eval: the optimizer must be switched with ``optimizer.train()``
            before training steps and ``optimizer.eval()`` before
            evaluation and checkpointing (schedule-free methods). optiplug
            also detects the two methods on any optimizer; the flag
            declares it, so ``optiplug show`` and the conformance suite
            can rely on it.
        step_closure: ``step`` must be given a closure that zeroes the
            gradients, recomputes the loss, calls ``backward`` and returns
            the loss (line searches, sharpness-aware methods, torch's
            L-BFGS); :func:`optiplug.base.training_step` passes one.
        create_graph: gradients must be taken with
            ``backward(create_graph=True)``, because the step differentiates
            them again (Hutchinson Hessian estimates: AdaHessian, Sophia-H);
            :func:`optiplug.base.training_step` and
            :meth:`optiplug.Graph.backward` do so.
        example_shape: the parameter shape the conformance checks use
            (None: 4x4); give one large enough for the kernels' real path
            (a blockwise-quantized state needs thousands of elements).
        example_dtype: the parameter dtype the checks use (None:
            ``"float64"``); give the one the kernels support.
        hf_names: the ``TrainingArguments(optim=...)`` names it serves
            (:class:`HFName`; a plain string is a name served as it is).
    """

    name: str
    factory: Callable[..., Any]
    defaults: dict[str, Any] = attrs.field(factory=dict, converter=_to_dict)
    config: type | None = None
    description: str = ""
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_to_names)
    state_slots: tuple[StateSlot, ...] | None = None
    implementations: tuple[ImplementationSpec, ...] = attrs.field(
        default=(), converter=_to_implementations
    )
    capabilities: frozenset[str] = attrs.field(default=frozenset(), converter=_to_tags)
    example_hparams: dict[str, Any] = attrs.field(factory=dict, converter=_to_dict)
    provider: ProviderInfo | None = None
    origin: Origin | None = None
    group_state: tuple[str, ...] = attrs.field(default=(), converter=_to_names)
    train_eval: bool = False
    step_closure: bool = False
    create_graph: bool = False
    example_shape: tuple[int, ...] | None = attrs.field(default=None, converter=_to_shape)
    example_dtype: str | None = None
    hf_names: tuple[HFName, ...] = attrs.field(default=(), converter=_to_hf_names)

    @property
    def hyperparameters(self) -> tuple[Hyperparameter, ...]:
        """Each hyperparameter with its effective default and constraint."""
        found = hyperparameters_of(self.config, self.factory)
        return tuple(attrs.evolve(h, default=self.defaults.get(h.name, h.default)) for h in found)

    @property
    def summary(self) -> str:
        """The first line of the description (or of the factory's docstring)."""
        return summary_of(self.description, self.factory)


@attrs.frozen
class ScheduleSpec:
    """A learning-rate schedule a plugin provides.

    Attributes:
        name: the name users type (``"cosine"``).
        factory: ``(**kwargs) -> Schedule``; validates its parameters.
        description: one paragraph; its first line is the summary.
        aliases: other names that resolve to this one.
        provider: filled in by the registry.
    """

    name: str
    factory: Callable[..., Any]
    description: str = ""
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_to_names)
    provider: ProviderInfo | None = None

    @property
    def summary(self) -> str:
        """The first line of the description (or of the factory's docstring)."""
        return summary_of(self.description, self.factory)


@attrs.frozen
class CommandSpec:
    """A subcommand of the ``optiplug`` command line a plugin provides.

    The built-in commands (``list``, ``show``, ``train``...) are records like
    this one, returned from the same hook (``optiplug_cli_commands``).

    Attributes:
        name: the subcommand users type (``"train"``).
        help: one line for ``optiplug --help``.
        configure: ``(argparse.ArgumentParser) -> None``; adds the arguments.
        run: ``(argparse.Namespace) -> int``; the exit status. An
            :class:`~optiplug.errors.OptiplugError` it raises is printed as
            one line and exits 2.
        description: a paragraph for ``optiplug NAME --help``.
        provider: filled in by the registry.
    """

    name: str
    help: str
    configure: Callable[..., Any]
    run: Callable[..., Any]
    description: str = ""
    provider: ProviderInfo | None = None


@attrs.frozen
class SelectionRequest:
    """What ``AutoOptimizer`` knows when it asks plugins for candidates.

    Attributes:
        task: normalised task name, or None.
        num_parameters: parameter count N, or None when unknown.
        parameters_exact: True when N was counted, False when estimated.
        config: the model config mapping, if any.
        model_type: e.g. ``"gpt2"`` or a module class name, if known.
        stage: ``"pretraining"``, ``"finetuning"`` or None.
        total_steps: how many optimizer steps the run will take (its
            horizon), or None when unknown: a schedule that needs the length
            cannot be set then, which a rule may weigh.
    """

    task: str | None = None
    num_parameters: int | None = None
    parameters_exact: bool = False
    config: Mapping[str, Any] | None = None
    model_type: str | None = None
    stage: str | None = None
    total_steps: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Every field by name (what pickles of older releases hold too)."""
        return {field.name: getattr(self, field.name) for field in attrs.fields(type(self))}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore ``state``; a field added since it was pickled (``total_steps``) gets its default."""
        for field in attrs.fields(type(self)):
            object.__setattr__(self, field.name, state.get(field.name, field.default))


@attrs.frozen
class Candidate:
    """One scored proposal from a selection rule.

    Attributes:
        algorithm: the optimizer name to create.
        hparams: its hyperparameters.
        score: higher wins.
        reason: why the rule proposes it (shown by ``explain``).
        schedule: an optional schedule (or schedule name) to pair it with.
        rule: the rule's name, for ``explain``.
        provider: filled in by the registry.
    """

    algorithm: str
    hparams: dict[str, Any] = attrs.field(factory=dict, converter=_to_dict)
    score: float = 0.0
    reason: str = ""
    schedule: Any = None
    rule: str = ""
    provider: ProviderInfo | None = None


@attrs.frozen(order=True)
class Problem:
    """One problem found while validating an optimizer state dict.

    Problems sort by group, parameter, slot and kind, so reports are stable.

    Attributes:
        group: param-group index, or None for top-level problems.
        parameter: parameter name (or ``"#index"`` when unnamed), or None.
        slot: state slot or group key concerned, or None.
        kind: short machine-readable kind (``"shape"``, ``"dtype"``...).
        expected: what was expected.
        found: what was found.
    """

    group: int = attrs.field(default=-1, converter=_to_group)
    parameter: str = ""
    slot: str = ""
    kind: str = ""
    expected: str = ""
    found: str = ""

    def __str__(self) -> str:
        where: list[str] = []
        if self.group >= 0:
            where.append(f"group {self.group}")
        if self.parameter:
            where.append(f"parameter {self.parameter}")
        if self.slot:
            where.append(f"slot {self.slot!r}")
        location = ", ".join(where) or "state dict"
        return f"{location}: {self.kind}: expected {self.expected}, found {self.found}"


@attrs.frozen
class PluginInfo:
    """A plugin as ``optiplug.plugins()`` and ``optiplug list`` report it.

    Attributes:
        name: short plugin name (the entry-point name).
        distribution: the installed distribution that provided it.
        version: that distribution's version.
        status: ``active``, ``disabled``, ``unavailable``, ``failed`` or
            ``incompatible``.
        provides: ``"kind:name"`` for each registered record.
        error: why it is not active, if it is not.
        module: the module (entry-point value) it was loaded from.
    """

    name: str
    distribution: str
    version: str
    status: str = attrs.field(validator=attrs.validators.in_(PLUGIN_STATUSES))
    provides: tuple[str, ...] = ()
    error: str | None = None
    module: str = ""
