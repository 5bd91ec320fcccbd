"""The toolkit for plugin authors: everything a first-party plugin builds on.

Plugins (first-party or not) import only public modules: :mod:`optiplug`,
:mod:`optiplug.base`, :mod:`optiplug.validators`, :mod:`optiplug.errors`
and :mod:`optiplug.testing`. This one holds the pieces that import torch:

* :class:`TorchBackedOptimizer` and :func:`torch_backed_optimizer`: torch's
  own optimizer class (fused/foreach Adam, AdamW, SGD) with validated
  hyperparameters, a measured choice of ``impl`` and validated state loading::

      class Adam(TorchBackedOptimizer, torch.optim.Adam):
          algorithm = "adam"
          config_class = AdamConfig

* :class:`KernelTableOptimizer`: an optimizer of one's own with several
  implementations (kernels) sharing one state layout, as torch's ``adamw()``
  dispatches to its single-tensor, multi-tensor and fused kernels.
* :func:`choose_implementation`: the measured choice among implementation
  records that :func:`optiplug.create` makes.
* :class:`Prepared` and :func:`accepts_prepared`: what
  :func:`optiplug.create` decided (validated keywords and config, param
  groups, chosen implementation), handed to a class whose ``__init__``
  accepts it, so that it neither validates nor chooses again.
* :func:`validated_config`, :func:`named_param_groups`,
  :func:`parameter_tensors`, :func:`group_overrides`: the ``params`` and
  hyperparameter handling every optimizer repeats.
* :func:`build_c_library` (:class:`NativeLibrary`): a small C kernel built
  with the system's C compiler in about 0.1 s and kept per machine, for a
  CPU kernel that should not wait seconds for ``torch.compile``.
* :func:`warn_at_caller` / :func:`caller_stacklevel`: warnings that point at
  the user's line, not at optiplug or torch.

Plugin entry-point modules must not import torch (``optiplug list`` imports
them): name optimizer classes with :func:`optiplug.lazy` there.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any, ClassVar, Protocol, cast

import attrs
import torch

from ._choice import timing as _timing
from ._choice.chooser import Tuning, chooser_of
from ._core import decision as _decision
from ._core import groups as _groups
from ._core import lifecycle as _mode
from ._core.decision import Prepared, accepts_prepared
from ._core.implementations import (
    TORCH_IMPLEMENTATION_FLAGS,
    foreach_supported,
    fused_supported,
    torch_implementations,
)
from ._core.params import (
    GROUP_META_KEYS,
    NamedParamGroup,
    group_overrides,
    named_param_groups,
    parameter_tensors,
)
from ._core.routing import Routing
from ._core.specs import ImplementationSpec
from ._lazy import lazy
from ._native import NativeLibrary, build_c_library
from ._state.codec import (
    LOW_RANK,
    NO_SLOTS,
    SECOND_MOMENTS,
    QuantizedState,
    convert_state,
    group_precision,
    step_in_state_precision,
)
from ._state.load import load_state_dict
from ._state.native_adam import fused_adam_step
from ._state.native_blocks import (
    CODEC_C_SOURCE,
    c_library_or_none,
    c_step_applies,
    codec_tables,
    seed_term,
)
from ._state.native_state import (
    StateKernel,
    StateKernelSource,
    build_state_kernel,
    fused_sgd_step,
    state_kernel_or_none,
)
from ._state.values import copied_tensor, is_subclass_tensor
from .errors import ClosureRequiredError, HyperparameterError
from .validators import reject_unknown

__all__ = [
    "GROUP_META_KEYS",
    "Kernel",
    "KernelTableOptimizer",
    "LOW_RANK",
    "NativeLibrary",
    "NamedParamGroup",
    "Prepared",
    "QuantizedState",
    "StateKernel",
    "StateKernelSource",
    "Supports",
    "TorchBackedOptimizer",
    "ValidatedLoading",
    "accepts_prepared",
    "build_c_library",
    "build_state_kernel",
    "caller_stacklevel",
    "cautious_weight_decay",
    "choose_implementation",
    "ClosureStep",
    "closure_loss",
    "convert_state",
    "count_layers",
    "excluded_implementations",
    "ExternalOptimizer",
    "external_implementations",
    "external_optimizer",
    "foreach_supported",
    "fused_supported",
    "group_overrides",
    "named_param_groups",
    "param_groups",
    "param_groups_report",
    "parameter_tensors",
    "set_training",
    "step_in_state_precision",
    "torch_backed_optimizer",
    "training_step",
    "validated_config",
    "warn_at_caller",
    "CODEC_C_SOURCE",
    "c_library_or_none",
    "c_step_applies",
    "codec_tables",
    "group_precision",
    "seed_term",
    "state_kernel_or_none",
]


Prepared.__module__ = __name__  # the public path, for pickles and docs
QuantizedState.__module__ = __name__  # checkpoints record the class by its public path
convert_state.__module__ = __name__
step_in_state_precision.__module__ = __name__
StateKernel.__module__ = __name__
StateKernelSource.__module__ = __name__
build_state_kernel.__module__ = __name__
accepts_prepared.__module__ = __name__
NativeLibrary.__module__ = __name__
build_c_library.__module__ = __name__


class Kernel(Protocol):
    """One implementation's update, in place: ``kernel(params, grads, *state, **options)``.

    Every kernel of a :class:`KernelTableOptimizer` has the same signature;
    any function does (this protocol only names the role).
    """

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """Update the tensors of one param group in place."""


class Supports(Protocol):
    """``(params) -> bool``: whether an implementation can run these parameter tensors."""

    def __call__(self, params: Sequence[torch.Tensor], /) -> bool:
        """True when every tensor (device, dtype, layout) is supported."""


_UNSET: Any = object()
_OWN_PACKAGES = frozenset({"optiplug", "torch"})


# ------------------------------------------------------------------ helpers
def closure_loss(closure: Callable[[], Any] | None) -> Any:
    """Evaluate an ``Optimizer.step`` closure with gradients enabled (None gives None).

    ``step`` runs under ``torch.no_grad()``; the closure recomputes the loss
    and its gradients, so it needs them back on.

    Args:
        closure: the closure given to ``step``, or None.

    Returns:
        What the closure returned (the loss), or None.
    """
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def caller_stacklevel(packages: Iterable[str] = ()) -> int:
    """The ``stacklevel`` that points a warning at the first frame outside the library.

    Call it in the function that calls :func:`warnings.warn`; frames of
    ``optiplug``, ``torch`` and ``packages`` (top-level package names, e.g.
    your plugin's) are skipped, so the warning names the user's line however
    deep inside ``step()`` it was raised.

    Args:
        packages: further top-level packages to look through.

    Returns:
        The value for ``warnings.warn(..., stacklevel=...)``.
    """
    return _stacklevel(sys._getframe(1), packages)


def warn_at_caller(
    message: str, category: type[Warning] = UserWarning, *, packages: Iterable[str] = ()
) -> None:
    """``warnings.warn`` pointed at the first frame outside the library.

    Args:
        message: the warning's text.
        category: its class.
        packages: further top-level packages to look through (your plugin's);
            ``optiplug`` and ``torch`` always are.
    """
    warnings.warn(message, category, stacklevel=_stacklevel(sys._getframe(0), packages))


def _stacklevel(frame: FrameType | None, packages: Iterable[str]) -> int:
    """Levels from ``frame`` (level 1) up to the first frame outside the skipped packages."""
    own = _OWN_PACKAGES | set(packages)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in own:
        frame, level = frame.f_back, level + 1
    return level


def param_groups(
    params: Iterable[Any] | torch.nn.Module,
    *,
    model: torch.nn.Module | None = None,
    no_decay: str | Sequence[str] | None = None,
    layer_decay: float | None = None,
    num_layers: int | None = None,
    hparams: Mapping[str, Any] | None = None,
    lr_keys: Sequence[str] = ("lr",),
    weight_decay_keys: Sequence[str] = ("weight_decay",),
) -> list[dict[str, Any]]:
    """Param groups without weight decay for norms/biases/embeddings, and with layer-wise lr decay.

    What ``optiplug.create(..., no_decay=..., layer_decay=...)`` does for
    every algorithm; composite optimizers (``multi``) call it per part, and
    any ``torch.optim`` optimizer takes its result. Rules: docs/param_groups.md.

    Args:
        params: tensors, ``(name, tensor)`` pairs, param-group dicts (split
            further, settings kept), or an ``nn.Module``.
        model: the module, to classify parameters by module type
            (``torch.nn.modules.normalization``, ``_NormBase``, ``nn.Embedding``).
        no_decay: ``"auto"``, a list of ``fnmatch`` globs on parameter names
            (may include ``"auto"``), or None.
        layer_decay: lr scale ``layer_decay ** (num_layers - layer_id)``, or None.
        num_layers: override of :func:`count_layers` (blocks + 1).
        hparams: base hyperparameters (the ``lr`` to scale, the weight decay).
        lr_keys: learning-rate keys to scale.
        weight_decay_keys: weight-decay keys to zero.

    Returns:
        Param-group dicts (``(name, tensor)`` pairs when every parameter is named).

    Raises:
        HyperparameterError: a bad value, or names needed and missing.
    """
    return _groups.param_groups(
        params,
        model=model,
        no_decay=no_decay,
        layer_decay=layer_decay,
        num_layers=num_layers,
        hparams=hparams,
        lr_keys=lr_keys,
        weight_decay_keys=weight_decay_keys,
    )


def count_layers(names: Iterable[str | None]) -> int:
    """``num_layers`` for ``layer_decay``: transformer blocks (``h.3.``, ``layers.3.``...) + 1.

    Args:
        names: every parameter name of the model.

    Returns:
        The highest block index + 2, or 1 without blocks.
    """
    return _groups.count_layers(names)


def param_groups_report(optimizer: torch.optim.Optimizer) -> Routing:
    """Per parameter: its lr, weight decay and why (a printable :class:`~optiplug.Routing`).

    Args:
        optimizer: any optimizer; ``routing()`` rows (muon, multi) are kept
            and extended with the grouping reasons.

    Returns:
        A :class:`~optiplug.Routing`: ``print()`` it, or index it by name.
    """
    return _groups.param_groups_report(optimizer)


def validated_config(
    algorithm: str, config_class: type, params: Sequence[Any], hparams: Mapping[str, Any]
) -> Any:
    """Validate ``hparams``, and each param group's overrides merged over them.

    Args:
        algorithm: the algorithm's name, for error messages.
        config_class: the attrs class validating its hyperparameters.
        params: the (materialised) ``params`` argument.
        hparams: the constructor's keywords.

    Returns:
        The ``config_class`` instance of ``hparams``.

    Raises:
        HyperparameterError: naming the algorithm, field and value.
    """
    return _decision.validate(algorithm, hparams, params, config=config_class)


def excluded_implementations() -> dict[tuple[str, str], dict[str, str]]:
    """The implementations ``impl=None`` left out in this process, and why.

    Keyed by ``(algorithm, tensor kinds)``, e.g. ``("adamw", "cpu/torch.float32
    DTensor")`` for FSDP2's sharded parameters; each value maps an
    implementation to its reason ("needs a CUDA device", "does not support
    these parameters (...)"). The latest choice per key is kept.

    Returns:
        A copy of the record.
    """
    return chooser_of().exclusions()


def choose_implementation(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    params: Iterable[Any],
    hparams: Mapping[str, Any],
) -> ImplementationSpec:
    """The implementation :func:`optiplug.create` would choose among ``candidates``.

    Only candidates that can run the parameters (``candidate.can_run``) take
    part. Among them the fastest wins, timed once by the default registry's
    chooser (``optiplug.default_registry().chooser``) on synthetic tensors
    shaped like ``params`` (never on them; the global RNG is left alone) and
    kept per algorithm, device type and dtype. With
    ``OPTIPLUG_AUTOTUNE=0``, a single runnable candidate or no parameters,
    nothing is timed: the highest ``priority`` wins (then the name).

    Args:
        algorithm: the algorithm's name (part of the cache key).
        candidates: its implementation records; each ``factory`` builds the
            optimizer forced to that implementation (used for timing).
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        hparams: hyperparameters to time with.

    Returns:
        The chosen record.

    Raises:
        HyperparameterError: (field ``impl``) no candidate can run ``params``.
    """
    return _choose(algorithm, candidates, parameter_tensors(params), hparams, None)


def _choose(
    algorithm: str,
    candidates: Sequence[ImplementationSpec],
    tensors: Sequence[torch.Tensor],
    hparams: Mapping[str, Any],
    config: Any,
    follow: list[Tuning] | None = None,
) -> ImplementationSpec:
    """:func:`choose_implementation` on tensors, timing candidates built from ``config``."""
    chosen = chooser_of().select(
        algorithm, candidates, None, tensors, hparams, config=config, follow=follow
    )
    if chosen is None:
        names = ", ".join(sorted(c.name for c in candidates)) or "none given"
        raise HyperparameterError(
            "impl",
            None,
            f"no implementation supports these parameters ({_timing.tensor_kinds(tensors)}); "
            f"candidates: {names}",
            algorithm=algorithm,
        )
    return chosen


def _prepare(
    cls: type[_ContractOptimizer],
    params: Iterable[Any] | Prepared,
    lr: Any,
    impl: str | None,
    hparams: dict[str, Any],
    follow: list[Tuning],
) -> tuple[list[Any], Any, str]:
    """The constructor sequence: validate, then choose (or check) the implementation.

    Given a :class:`~optiplug.base.Prepared` (what :func:`optiplug.create`
    hands over) for this algorithm, with its config and an implementation of
    this class, nothing is validated or chosen again.

    Returns:
        ``(params as a list, the config instance, the implementation name)``.
    """
    config = None
    if isinstance(params, Prepared):
        if lr is not _UNSET or impl is not None or hparams:
            raise TypeError(f"{cls.__qualname__}: a Prepared is given alone, without keywords")
        prepared = params
        params, hparams, impl = list(prepared.params), dict(prepared.hparams), prepared.impl
        if prepared.algorithm == cls.algorithm and isinstance(prepared.config, cls.config_class):
            config = prepared.config
            if impl is not None and impl in cls.implementation_names():
                return params, config, impl
    else:
        if lr is not _UNSET:
            hparams["lr"] = lr
        params = list(params)
    if config is None:
        config = validated_config(cls.algorithm, cls.config_class, params, hparams)
    tensors = parameter_tensors(params)
    candidates = cls.implementation_specs()
    if impl:
        forced = chooser_of().select(
            cls.algorithm, candidates, impl, tensors, hparams, config=config
        )
        if forced is None:  # select() returns the forced record or raises
            raise AssertionError("a forced implementation was not selected")
        return params, config, forced.name
    chosen = _choose(cls.algorithm, candidates, tensors, hparams, config, follow)
    return params, config, chosen.name


def _not_torch_keywords(cls: type, options: Mapping[str, Any]) -> list[str]:
    """Config fields the torch class's ``__init__`` does not take (optiplug's own group keys)."""
    accepted = _torch_keywords(cls)
    return [] if accepted is None else [key for key in options if key not in accepted]


@functools.cache
def _torch_keywords(cls: type) -> frozenset[str] | None:
    """The keywords of the torch class under ``cls`` (read once per class), or None."""
    torch_class: type | None = next(
        (base for base in cls.__mro__ if base.__module__.startswith("torch.optim")), None
    )
    if torch_class is None:
        return None
    return frozenset(inspect.signature(vars(torch_class)["__init__"]).parameters)


def cautious_weight_decay(optimizer: torch.optim.Optimizer, step: Callable[[], Any]) -> Any:
    """Run ``step`` with cautious weight decay in the groups that ask for it.

    A group with ``weight_decay_mode="cautious"`` and a non-zero decoupled
    ``weight_decay`` steps without decay, then decays only the coordinates
    where the step's update ``u`` (``p -= lr * u``) and the parameter agree
    in sign: ``p -= lr * wd * p_old * [u * p_old >= 0]`` (Chen et al. 2025,
    "Cautious Weight Decay", arXiv 2510.12402; a zero product counts as
    agreement). It costs a copy of those groups' parameters during the
    step. Other groups step as they are, in the same call.

    Args:
        optimizer: an optimizer whose ``weight_decay`` is decoupled
            (``p *= 1 - lr * wd``, as ``torch.optim.AdamW``).
        step: its step, called once.

    Returns:
        What ``step`` returns.
    """
    cautious = [
        group
        for group in optimizer.param_groups
        if group.get("weight_decay_mode") == "cautious" and group["weight_decay"] != 0
    ]
    if not cautious:
        return step()
    before = [[p.detach().clone() for p in group["params"]] for group in cautious]
    decays = [group["weight_decay"] for group in cautious]
    for group in cautious:
        group["weight_decay"] = 0.0
    try:
        found = step()
    finally:
        for group, decay in zip(cautious, decays, strict=True):
            group["weight_decay"] = decay
    with torch.no_grad():
        for group, olds in zip(cautious, before, strict=True):
            rate = group["lr"] * group["weight_decay"]
            for param, old in zip(group["params"], olds, strict=True):
                agree = (param - old) * old <= 0  # u = (old - new) / lr agrees with old
                param.sub_(old * agree * rate)
    return found


# ------------------------------------------------------------------ classes
class ValidatedLoading(torch.optim.Optimizer):
    """Mixin: ``load_state_dict`` validates first and loads all-or-nothing.

    Same rules as :func:`optiplug.load_state_dict` with ``strict=True``: state
    is matched by parameter name when both sides have names, every tensor is
    copied (never aliased), and on any problem nothing changes. The
    optimizer keeps its own implementation flags
    (``foreach``/``fused``/``capturable``/``differentiable``): they describe
    how the saving optimizer ran, not the state.
    """

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, without importing ``torch._dynamo`` outside a compile.

        torch wraps the method so that a compile does not trace into it; the
        wrapper imports ``torch._dynamo`` on first use, about a second on a
        small CPU machine, in every process that builds an optimizer. Outside
        a compile the wrapped function runs directly; inside one, the wrapper.
        A class between this one and torch's (a library's optimizer that
        overrides the method, torchao's or SaRA's) runs its own as ever.

        Args:
            param_group: the group, as ``torch.optim.Optimizer`` takes it.
        """
        following = super().add_param_group  # a library class's own override comes first
        wrapped = torch.optim.Optimizer.add_param_group
        plain = getattr(wrapped, "__wrapped__", None)
        is_torchs = getattr(following, "__func__", None) is wrapped
        if is_torchs and plain is not None and not torch.compiler.is_compiling():
            plain(self, param_group)
        else:
            following(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Validate ``state_dict``, then load it all-or-nothing.

        Args:
            state_dict: as returned by ``state_dict()`` here or in torch.

        Raises:
            StateDictError: with ``.problems``, every problem found.
        """
        load_state_dict(self, state_dict, strict=True)

    second_moments: ClassVar[frozenset[str]] = SECOND_MOMENTS
    """State slots kept with the unsigned table without zero when a group's
    ``state_precision`` is int8 or int4 (second moments: never negative, and
    never to be rounded to zero)."""

    linear_slots: ClassVar[frozenset[str]] = NO_SLOTS
    """State slots kept with the linear signed table (evenly spaced codes)
    instead of the dynamic one when a group's ``state_precision`` is int8 or
    int4; none by default (Muon names its momentum)."""

    low_rank_slots: ClassVar[frozenset[str]] = NO_SLOTS
    """State slots that, when a group's ``state_precision`` is int8 or int4
    and the slot is a matrix, keep float32 factors of rank
    :data:`LOW_RANK` beside codes of the residual, so rounding spares the
    matrix's small singular directions; none by default (Muon names its
    momentum, which Newton-Schulz orthogonalizes)."""


class _ContractOptimizer(ValidatedLoading, torch.optim.Optimizer):
    """What both optimizer bases share: an algorithm name, a config class, implementations."""

    algorithm: ClassVar[str] = ""
    config_class: ClassVar[type]

    @classmethod
    def implementation_specs(cls, target: str | None = None) -> tuple[ImplementationSpec, ...]:
        """This class's implementations as records."""
        raise NotImplementedError

    @classmethod
    def implementation_names(cls) -> frozenset[str]:
        """The names of this class's implementations."""
        raise NotImplementedError

    def switch_implementation(self, name: str) -> None:
        """Run implementation ``name`` from the next step on (the state carries over)."""
        raise NotImplementedError

    def _follow(self, follow: list[Tuning]) -> None:
        """Hold the background measurement started while choosing, if any."""
        if follow:
            setattr(self, _decision.TUNING_ATTRIBUTE, follow[-1])

    def _take_measured_choice(self) -> None:
        """Between steps: switch to the measured winner once its measurement is done.

        Called at the start of ``step()`` and when :attr:`impl` is read.
        """
        tuning = self.__dict__.get(_decision.TUNING_ATTRIBUTE)
        if tuning is None or tuning.pending:
            return
        del self.__dict__[_decision.TUNING_ATTRIBUTE]
        winner = tuning.winner
        if winner is not None and winner in self.implementation_names():
            self.switch_implementation(winner)

    @property
    def impl(self) -> str:
        """The implementation in use."""
        raise NotImplementedError


def _fused_step_of(
    optimizer: torch.optim.Optimizer,
) -> Callable[[torch.optim.Optimizer, dict[str, Any], torch.Tensor], bool] | None:
    """The C step of ``optimizer``'s low-precision state: Adam's, AdamW's, SGD's, or None."""
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return fused_adam_step
    if isinstance(optimizer, torch.optim.SGD):
        return fused_sgd_step
    return None


def _loss_scaling_done_here(optimizer: torch.optim.Optimizer) -> bool:
    """Unscale the gradients here when ``GradScaler`` left it to a fused step that will not run.

    ``GradScaler`` hands ``grad_scale`` and ``found_inf`` to an optimizer
    whose ``_step_supports_amp_scaling`` is set (torch sets it on one built
    fused) and lets the fused kernel unscale and skip. When the groups run
    loop or foreach instead (the measured winner took over), torch's
    kernels refuse those attributes; so the gradients are unscaled in place
    here, as the scaler does for every other optimizer, and the attributes
    are set to None for this step (the scaler deletes them afterwards).

    Args:
        optimizer: the optimizer about to step.

    Returns:
        Whether the step must be skipped (the scaler found inf or NaN).
    """
    grad_scale = getattr(optimizer, "grad_scale", None)
    found_inf = getattr(optimizer, "found_inf", None)
    fused = all(group.get("fused") for group in optimizer.param_groups)
    if fused or (grad_scale is None and found_inf is None):
        return False
    optimizer.grad_scale = optimizer.found_inf = None  # type: ignore[attr-defined]
    if found_inf is not None and bool(found_inf.item()):
        return True
    if grad_scale is not None:
        inverse = grad_scale.double().reciprocal().float()  # the scaler's own unscale factor
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        param.grad.mul_(inverse.to(param.grad.device))
    return False


class TorchBackedOptimizer(_ContractOptimizer):
    """Mixin for an optimizer that is torch's own class plus optiplug's contract.

    Subclasses list it before the torch class and set :attr:`algorithm` and
    :attr:`config_class` (or use :func:`torch_backed_optimizer`).
    Hyperparameters are keyword arguments (``lr`` may also be positional);
    ``impl`` picks ``"loop"``, ``"foreach"`` or ``"fused"``, or, when None,
    the fastest supported one by measurement.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: the learning rate (also accepted as a keyword).
        impl: implementation name, or None to measure.
        **hparams: the algorithm's other hyperparameters.

    Raises:
        HyperparameterError: an unknown keyword, a bad value, or an ``impl``
            that does not exist or cannot run these parameters.
    """

    @accepts_prepared
    def __init__(
        self,
        params: Iterable[Any] | Prepared,
        lr: Any = _UNSET,
        *,
        impl: str | None = None,
        **hparams: Any,
    ) -> None:
        follow: list[Tuning] = []
        params, config, chosen = _prepare(type(self), params, lr, impl, hparams, follow)
        options: dict[str, Any] = {
            **attrs.asdict(config, recurse=False),
            **TORCH_IMPLEMENTATION_FLAGS[chosen],
        }
        own = {key: options.pop(key) for key in _not_torch_keywords(type(self), options)}
        super().__init__(params, **options)  # the torch class's keywords (lr=..., fused=...)
        self.defaults.update(own)  # optiplug's own keys: groups added later get them too
        for group in self.param_groups:
            for key, value in own.items():
                group.setdefault(key, value)
        self._follow(follow)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step of torch's update, with the implementation measured fastest once known.

        Groups with ``weight_decay_mode="cautious"`` (an algorithm with
        decoupled weight decay that declares the mode) decay only the
        coordinates whose update agrees in sign with the parameter
        (:func:`cautious_weight_decay`). Groups with a ``state_precision``
        other than ``"fp32"`` step one parameter at a time on decoded state
        (:func:`step_in_state_precision`): torch's own arithmetic, on the
        values the codes hold. Under ``GradScaler``, an optimizer built
        fused but now running loop or foreach unscales and skips as the
        scaler would have (:func:`_loss_scaling_done_here`).

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        self._take_measured_choice()
        loss = closure_loss(closure)
        if _loss_scaling_done_here(self):
            return loss
        torch_step = super().step
        fused = _fused_step_of(self)
        cautious_weight_decay(
            self,
            lambda: step_in_state_precision(
                self,
                torch_step,
                self.second_moments,
                fused,
                self.linear_slots,
                self.low_rank_slots,
            ),
        )
        return loss

    def switch_implementation(self, name: str) -> None:
        """Run ``loop``, ``foreach`` or ``fused`` from the next step on.

        The three share torch's state layout; the fused kernels keep the
        ``step`` counter as a float32 tensor on the parameter's device, so
        it is moved there when switching to ``fused``.
        """
        flags = TORCH_IMPLEMENTATION_FLAGS[name]
        for group in self.param_groups:
            group.update(flags)
        self._step_supports_amp_scaling = flags["fused"]  # GradScaler: who unscales
        if not flags["fused"]:
            return
        for param, state in self.state.items():
            step = state.get("step")
            if torch.is_tensor(step) and (
                step.device != param.device or step.dtype != torch.float32
            ):
                state["step"] = step.to(device=param.device, dtype=torch.float32)

    @classmethod
    def implementation_specs(cls, target: str | None = None) -> tuple[ImplementationSpec, ...]:
        """This class's implementations as records (``loop``, ``foreach``, ``fused``).

        Args:
            target: ``"module:Class"`` naming this class, for records a
                registry keeps (lazy, picklable factories); None gives
                factories bound to the class itself.

        Returns:
            One record per implementation; each factory forces it.
        """
        records = torch_implementations(cls.algorithm, target or f"{cls.__module__}:{cls.__name__}")
        if target is not None:
            return records
        return tuple(attrs.evolve(r, factory=functools.partial(cls, impl=r.name)) for r in records)

    @classmethod
    def implementation_names(cls) -> frozenset[str]:
        """``loop``, ``foreach`` and ``fused``."""
        return frozenset(TORCH_IMPLEMENTATION_FLAGS)

    @property
    def impl(self) -> str:
        """The implementation in use: ``"fused"``, ``"foreach"`` or ``"loop"``.

        While ``impl=None`` measures in the background, the one that runs
        meanwhile; the measured one once the measurement is done.
        """
        self._take_measured_choice()
        group = self.param_groups[0] if self.param_groups else {}
        if group.get("fused"):
            return "fused"
        return "foreach" if group.get("foreach") else "loop"


def torch_backed_optimizer(
    algorithm: str,
    torch_class: type[torch.optim.Optimizer],
    config_class: type,
    *,
    name: str | None = None,
    module: str | None = None,
    doc: str | None = None,
) -> type[TorchBackedOptimizer]:
    """Build the :class:`TorchBackedOptimizer` subclass of ``torch_class``.

    Equivalent to writing::

        class Adam(TorchBackedOptimizer, torch.optim.Adam):
            algorithm = "adam"
            config_class = AdamConfig

    Give ``module`` (and ``name``) where the class is importable from, so it
    pickles; the module must return this same class object for ``name``
    (e.g. build it once in a module ``__getattr__`` and cache it).

    Args:
        algorithm: the algorithm's name.
        torch_class: the torch optimizer class (``torch.optim.Adam``).
        config_class: the attrs class validating the hyperparameters.
        name: the class name; defaults to ``torch_class``'s.
        module: the importable module that exposes the class; defaults to
            the caller's module.
        doc: the class docstring.

    Returns:
        The new optimizer class.

    Raises:
        TypeError: ``torch_class``'s signature does not name both ``foreach``
            and ``fused`` (a class from another library: wrap it with
            :func:`external_optimizer`).
    """
    missing = {"foreach", "fused"} - _named_keywords(torch_class)
    if missing:
        raise TypeError(
            f"torch_backed_optimizer: {torch_class.__qualname__} does not name "
            f"{' or '.join(sorted(missing))} in its signature, so its loop/foreach/fused "
            "implementations cannot be chosen; wrap it with "
            "optiplug.base.external_optimizer instead"
        )
    name = name or torch_class.__name__
    namespace: dict[str, Any] = {
        "algorithm": algorithm,
        "config_class": config_class,
        "__module__": module or sys._getframe(1).f_globals.get("__name__", __name__),
        "__qualname__": name,
        "__doc__": doc or f"{torch_class.__name__} with optiplug's contract ({algorithm}).",
    }
    return cast(
        "type[TorchBackedOptimizer]", type(name, (TorchBackedOptimizer, torch_class), namespace)
    )


_NOT_NAMED = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
_EXTERNAL_PRIORITY = {"foreach": 1, "loop": 0, "default": 0, "fused": -1}
"""``fused`` last: which devices an external fused kernel runs on is the library's to say."""


def _init_signature(cls: type) -> inspect.Signature:
    """The signature of ``cls.__init__`` as looked up on the class (``self`` included)."""
    init: Callable[..., Any] = cls.__dict__.get("__init__") or next(
        k.__dict__["__init__"] for k in cls.__mro__ if "__init__" in k.__dict__
    )
    return inspect.signature(init)


def _named_keywords(cls: type) -> frozenset[str]:
    """The keywords ``cls.__init__`` names (a ``**kwargs`` names none: what it swallows is unknown)."""
    try:
        parameters = _init_signature(cls).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(p.name for p in parameters if p.kind not in _NOT_NAMED) - {"self", "params"}


def external_implementations(cls: type) -> dict[str, dict[str, bool]]:
    """The implementations an external optimizer class offers, from the flags its signature names.

    ``fused`` and ``foreach`` count only when ``cls.__init__`` names them; a
    class that takes neither (or swallows them in ``**kwargs``) has one
    implementation, ``"default"``: its own, whatever it does.

    Args:
        cls: the optimizer class.

    Returns:
        ``{implementation: constructor flags}``.
    """
    named = _named_keywords(cls) & {"foreach", "fused"}
    if not named:
        return {"default": {}}
    table = {
        name: {k: v for k, v in flags.items() if k in named}
        for name, flags in TORCH_IMPLEMENTATION_FLAGS.items()
    }
    return {name: flags for name, flags in table.items() if name == "loop" or flags.get(name)}


class ExternalOptimizer(ValidatedLoading, torch.optim.Optimizer):
    """Mixin for a third-party optimizer class plus optiplug's contract.

    Build subclasses with :func:`external_optimizer`. The constructor
    validates the keywords (with :attr:`config_class` when given, else
    against the class's signature: a keyword the signature does not name is
    refused with a did-you-mean even when the class would swallow it in
    ``**kwargs``), passes the class only the keywords its signature names,
    and chooses the implementation among those its signature offers (see
    :func:`external_implementations`): ``impl`` forces one; None takes
    ``foreach`` where offered, else ``loop`` (or ``default``). ``fused`` is
    never chosen unasked: which devices an external fused kernel runs on is
    the library's to say. :attr:`impl` reports what runs.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: the learning rate (also accepted as a keyword).
        impl: an implementation name, or None.
        **hparams: the class's other keywords.

    Raises:
        HyperparameterError: an unknown keyword, a bad value or an unknown ``impl``.
    """

    algorithm: ClassVar[str] = ""
    config_class: ClassVar[type | None] = None
    external_class: ClassVar[type]
    group_state: ClassVar[tuple[str, ...]] = ()

    @accepts_prepared
    def __init__(
        self,
        params: Iterable[Any] | Prepared,
        lr: Any = _UNSET,
        *,
        impl: str | None = None,
        **hparams: Any,
    ) -> None:
        if isinstance(params, Prepared):
            if lr is not _UNSET or impl is not None or hparams:
                raise TypeError(f"{type(self).__qualname__}: a Prepared is given alone")
            given, hparams, impl = list(params.params), dict(params.hparams), params.impl
        else:
            given = list(params)
            if lr is not _UNSET:
                hparams["lr"] = lr
        keywords = self._validated(given, hparams)
        table = external_implementations(self.external_class)
        chosen = self._chosen(table, impl)
        self._optiplug_impl = chosen
        flags: dict[str, Any] = dict(table[chosen])
        super().__init__(given, **keywords, **flags)

    def _validated(self, params: list[Any], hparams: dict[str, Any]) -> dict[str, Any]:
        """Validate ``hparams``; the keywords to pass the class (those its signature names)."""
        named = _named_keywords(self.external_class)
        if self.config_class is not None:
            config = _decision.validate(self.algorithm, hparams, params, config=self.config_class)
            values = attrs.asdict(config, recurse=False)
        else:
            reject_unknown(hparams, named - {"foreach", "fused"}, self.algorithm)
            _decision.validate(self.algorithm, hparams, params, factory=self.external_class)
            values = dict(hparams)
        return {k: v for k, v in values.items() if k in named and k not in ("foreach", "fused")}

    def _chosen(self, table: Mapping[str, Mapping[str, bool]], impl: str | None) -> str:
        if impl is None:
            return "foreach" if "foreach" in table else next(iter(table))
        if impl not in table:
            raise HyperparameterError(
                "impl",
                impl,
                f"{self.external_class.__name__} offers {', '.join(table)} "
                "(the flags its signature names)",
                algorithm=self.algorithm,
            )
        return impl

    @classmethod
    def implementation_specs(cls, target: str | None = None) -> tuple[ImplementationSpec, ...]:
        """One record per implementation the class's signature offers.

        Args:
            target: ``"module:Class"`` naming this class (lazy, picklable
                factories); None gives factories bound to the class itself.

        Returns:
            The records; each factory forces its implementation.
        """
        return tuple(
            ImplementationSpec(
                cls.algorithm,
                name,
                lazy(target, impl=name) if target else functools.partial(cls, impl=name),
                priority=_EXTERNAL_PRIORITY[name],
                description=f"{cls.external_class.__name__} with "
                + (", ".join(f"{k}={v}" for k, v in flags.items()) or "its own defaults"),
            )
            for name, flags in external_implementations(cls.external_class).items()
        )

    @property
    def impl(self) -> str:
        """The implementation that runs, read from the group flags the class keeps."""
        table = external_implementations(self.external_class)
        group = self.param_groups[0] if self.param_groups else {}
        if "fused" in table and group.get("fused"):
            return "fused"
        if "foreach" in table and group.get("foreach"):
            return "foreach"
        if "loop" in table and any(k in group for k in ("fused", "foreach")):
            return "loop"
        return str(self.__dict__.get("_optiplug_impl", next(iter(table))))

    def __getstate__(self) -> dict[str, Any]:
        """Torch's state plus the implementation chosen."""
        return {**super().__getstate__(), "_optiplug_impl": self.__dict__.get("_optiplug_impl")}

    def __deepcopy__(self, memo: dict[int, Any]) -> ExternalOptimizer:
        """A deep copy; tensor-subclass state is rebuilt from copies of its inner tensors.

        ``copy.deepcopy`` of a tensor calls ``clone``, which some quantized
        state subclasses do not implement.
        """
        _seed_subclass_copies(self.state, memo)
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        clone.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return clone

    def switch_implementation(self, name: str) -> None:
        """Run implementation ``name`` from the next step on (the state layout is the class's)."""
        table = external_implementations(self.external_class)
        if name not in table:
            raise KeyError(name)
        for group in self.param_groups:
            group.update(table[name])
        self._optiplug_impl = name


def _seed_subclass_copies(value: Any, memo: dict[int, Any]) -> None:
    """Put a copy of every tensor subclass in ``value`` (nested) into a deepcopy ``memo``."""
    if isinstance(value, torch.Tensor):
        if is_subclass_tensor(value) and id(value) not in memo:
            memo[id(value)] = copied_tensor(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _seed_subclass_copies(item, memo)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _seed_subclass_copies(item, memo)


def external_optimizer(
    algorithm: str,
    cls: type[torch.optim.Optimizer],
    config_class: type | None = None,
    *,
    group_state: Iterable[str] = (),
    name: str | None = None,
    module: str | None = None,
    doc: str | None = None,
    needs_closure: bool = False,
) -> type[ExternalOptimizer]:
    """Wrap a third-party optimizer class with optiplug's contract (:class:`ExternalOptimizer`).

    Validated keywords (an unknown one is refused even if the class swallows
    ``**kwargs``), only the keywords its signature names passed on,
    ``foreach``/``fused`` only when named there, an honest :attr:`impl`,
    and validated all-or-nothing state loading. Its train/eval methods, if
    any, are the class's own. Give ``module`` (and ``name``) where the class
    is importable from, so it pickles, as for :func:`torch_backed_optimizer`.

    Args:
        algorithm: the algorithm's registered name.
        cls: the optimizer class (``pytorch_optimizer.Adan``).
        config_class: an attrs class validating the hyperparameters; None
            validates by the class's signature and the well-known names.
        group_state: param-group keys holding running state (see
            :attr:`optiplug.OptimizerSpec.group_state`), for loading when
            the class is used without the registry.
        name: the class name; defaults to ``cls``'s.
        module: the importable module that exposes the class; defaults to
            the caller's module.
        doc: the class docstring.
        needs_closure: its ``step`` needs a closure (declare
            :attr:`optiplug.OptimizerSpec.step_closure` too): stepping
            without one raises :class:`~optiplug.errors.ClosureRequiredError`
            before the library's step runs (:class:`ClosureStep`).

    Returns:
        The new optimizer class.
    """
    name = name or cls.__name__
    bases = (ClosureStep, ExternalOptimizer, cls) if needs_closure else (ExternalOptimizer, cls)
    namespace: dict[str, Any] = {
        "algorithm": algorithm,
        "config_class": config_class,
        "external_class": cls,
        "group_state": tuple(group_state),
        "__module__": module or sys._getframe(1).f_globals.get("__name__", __name__),
        "__qualname__": name,
        "__doc__": doc or f"{cls.__name__} with optiplug's contract ({algorithm}).",
        "__signature__": _wrapper_signature(cls),
    }
    return cast("type[ExternalOptimizer]", type(name, bases, namespace))


class ClosureStep:
    """Mixin of an optimizer whose ``step`` needs a closure: without one it raises, typed.

    Its library's own step, called without a closure, fails on calling
    ``None`` (``'NoneType' object is not callable``) or on a missing
    argument; this one says what to pass before anything runs.
    """

    algorithm: ClassVar[str]

    def step(self, closure: Callable[[], Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        """Step with ``closure``, which re-evaluates the model and returns the loss.

        Raises:
            ClosureRequiredError: no closure was given; nothing changed.
        """
        if closure is None:
            raise ClosureRequiredError(self.algorithm)
        return super().step(closure, *args, **kwargs)  # type: ignore[misc]  # the library's step


def _wrapper_signature(cls: type) -> inspect.Signature:
    """``(params, lr, *, <the class's other named keywords>)``: what the wrapper accepts.

    Without ``**kwargs`` and without ``foreach``/``fused`` (``impl`` picks
    those), so ``optiplug show`` lists the class's hyperparameters with
    their defaults (a betas default declares the arity) and an unknown
    keyword is refused.
    """
    try:
        own = list(_init_signature(cls).parameters.values())
    except (TypeError, ValueError):
        own = []
    skipped = {"self", "params", "foreach", "fused"}
    kept = [p for p in own if p.kind not in _NOT_NAMED and p.name not in skipped]
    keyword = inspect.Parameter.KEYWORD_ONLY
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("params", positional)]
    parameters += [p.replace(kind=positional) for p in kept if p.name == "lr"]
    parameters += [p.replace(kind=keyword) for p in kept if p.name != "lr"]
    return inspect.Signature(parameters)


def set_training(optimizer: Any, training: bool) -> bool:
    """Switch an optimizer with a train/eval lifecycle (schedule-free) to train or eval mode.

    Call it with True before training steps, with False before evaluation
    and before saving a checkpoint; any other optimizer is left alone.

    Args:
        optimizer: any optimizer.
        training: the mode.

    Returns:
        Whether it has the lifecycle (declared by its spec's ``train_eval``
        or detected: callable ``train`` and ``eval`` methods).
    """
    return _mode.set_training(optimizer, training)


def training_step(optimizer: Any, loss_of: Callable[[], Any]) -> Any:
    """One training step the way the optimizer's spec asks (a closure, a kept graph).

    Zeroes the gradients, computes ``loss_of()``, calls ``backward`` (with
    ``create_graph=True`` when the spec declares
    :attr:`~optiplug.OptimizerSpec.create_graph`) and steps, passing a
    closure that does all of it when the spec declares
    :attr:`~optiplug.OptimizerSpec.step_closure`. A loop written with it
    runs every registered optimizer, L-BFGS and AdaHessian included::

        for batch in batches:
            loss = training_step(optimizer, lambda: loss_fn(model(batch)))

    Args:
        optimizer: any optimizer (one optiplug did not build is stepped plainly).
        loss_of: computes the loss from the current parameters.

    Returns:
        The loss (the closure's first evaluation when a closure is used).
    """
    return _mode.training_step(optimizer, loss_of)


class KernelTableOptimizer(_ContractOptimizer):
    """Base for an optimizer with several kernels that share one state layout.

    In the style of ``torch.optim.adamw()`` dispatching to its
    single-tensor, multi-tensor and fused kernels: each implementation is a
    function with one signature, ``kernel(params, grads, *state_lists,
    **options)``, updating the tensors in place. A subclass declares:

    * :attr:`algorithm` and :attr:`config_class` (the attrs class that
      validates the hyperparameters; its fields become the group defaults);
    * :attr:`implementations`: ``{"loop": kernel, "foreach": kernel, ...}``;
    * :attr:`supports` (optional): ``{"foreach": foreach_supported, ...}``,
      which implementations run which parameters (absent: all);
    * :attr:`priorities` (optional): the order when not measured
      (``OPTIPLUG_AUTOTUNE=0``), higher first (absent: 0, then by name);
    * :attr:`compiled` (optional): the implementations whose first steps
      compile; while ``impl=None`` measures in the background, the
      highest-priority other one runs, and the optimizer switches kernel
      between steps once the measurement is done;
    * :attr:`zero_state`: per-parameter state tensors, created as zeros like
      the parameter on its first step and passed, in this order, after
      ``params`` and ``grads``;
    * :attr:`state_kernel` (optional): the update of one element in C
      (:class:`StateKernelSource`) with :meth:`_state_kernel_scalars`: with
      ``impl="fused"`` a parameter whose state is stored in int8, int4 or
      bf16 then steps in one C pass over its codes (:func:`build_state_kernel`)
      instead of being decoded, stepped by the kernel and encoded.

    The constructor validates the hyperparameters (top level and per param
    group), then uses ``impl`` if given or :func:`choose_implementation`.
    ``step`` gathers each group's tensors (:meth:`_group_tensors`) and
    keywords (:meth:`_kernel_options`, by default the group's config fields)
    and calls the chosen kernel once per group. Override those two hooks for
    other state (e.g. a step counter) or packed hyperparameters; keep what
    they build inside ``step`` traceable by ``torch.compile`` (tuples,
    named tuples and dicts, not frozen attrs classes). Do not name a
    method ``_init_group``: ``torch.compile`` calls a method of that name
    eagerly and takes its result as a constant (torch's optimizers return
    flags such as ``has_complex``), so one returning tensors crashes tracing.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: the learning rate (also accepted as a keyword).
        impl: an implementation name, or None to choose the fastest
            supported one by measurement (cached per process).
        **hparams: the algorithm's other hyperparameters.

    Raises:
        HyperparameterError: an unknown keyword, a bad value, or an ``impl``
            (field ``impl``) that does not exist or cannot run ``params``.
    """

    implementations: ClassVar[Mapping[str, Kernel]] = {}
    supports: ClassVar[Mapping[str, Supports]] = {}
    priorities: ClassVar[Mapping[str, int]] = {}
    descriptions: ClassVar[Mapping[str, str]] = {}
    compiled: ClassVar[frozenset[str]] = frozenset()
    zero_state: ClassVar[tuple[str, ...]] = ()
    state_kernel: ClassVar[StateKernelSource | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for table in ("supports", "priorities", "descriptions"):
            unknown = set(getattr(cls, table)) - set(cls.implementations)
            if unknown:
                raise TypeError(
                    f"{cls.__qualname__}.{table} names {sorted(unknown)}, which are not in "
                    f"its implementations ({sorted(cls.implementations)})"
                )

    @accepts_prepared
    def __init__(
        self,
        params: Iterable[Any] | Prepared,
        lr: Any = _UNSET,
        *,
        impl: str | None = None,
        **hparams: Any,
    ) -> None:
        if not self.implementations:
            raise TypeError(f"{type(self).__qualname__} declares no implementations")
        follow: list[Tuning] = []
        params, config, chosen = _prepare(type(self), params, lr, impl, hparams, follow)
        self._impl = chosen
        super().__init__(params, attrs.asdict(config, recurse=False))
        self._follow(follow)

    @classmethod
    def implementation_specs(cls, target: str | None = None) -> tuple[ImplementationSpec, ...]:
        """This class's implementations as records, one per entry of :attr:`implementations`.

        Args:
            target: ``"module:Class"`` naming this class, for records a
                registry keeps (lazy, picklable factories); None gives
                factories bound to the class itself.

        Returns:
            One :class:`~optiplug.ImplementationSpec` per implementation;
            each factory builds this class forced to it.
        """
        return tuple(
            ImplementationSpec(
                cls.algorithm,
                name,
                lazy(target, impl=name) if target else functools.partial(cls, impl=name),
                supports=cls.supports.get(name),
                priority=cls.priorities.get(name, 0),
                description=cls.descriptions.get(name, ""),
                compiles=name in cls.compiled,
            )
            for name in cls.implementations
        )

    @classmethod
    def implementation_names(cls) -> frozenset[str]:
        """The keys of :attr:`implementations`."""
        return frozenset(cls.implementations)

    @property
    def impl(self) -> str:
        """The implementation in use (a key of :attr:`implementations`).

        While ``impl=None`` measures in the background, the one that runs
        meanwhile; the measured one once the measurement is done.
        """
        self._take_measured_choice()
        return self._impl

    def switch_implementation(self, name: str) -> None:
        """Run kernel ``name`` from the next step on (every kernel shares the state layout)."""
        if name not in self.implementations:
            raise KeyError(name)
        self._impl = name

    def __getstate__(self) -> dict[str, Any]:
        """Torch's state plus the implementation."""
        return {**super().__getstate__(), "_impl": self._impl}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore, keeping the implementation (``loop`` or the first for old pickles)."""
        super().__setstate__(state)
        if "_impl" not in self.__dict__:
            self._impl = (
                "loop" if "loop" in self.implementations else next(iter(self.implementations))
            )

    def _group_tensors(self, group: dict[str, Any]) -> tuple[list[torch.Tensor], ...]:
        """The kernel's tensor lists for one param group.

        By default ``(params, grads, *zero_state lists)`` over the
        parameters that have a gradient, creating missing state as zeros.

        Args:
            group: one of ``self.param_groups``.

        Returns:
            The positional arguments of the kernel; the first list empty
            means there is nothing to update.

        Raises:
            RuntimeError: a sparse gradient or a complex parameter.
        """
        params: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        slots: dict[str, list[torch.Tensor]] = {name: [] for name in self.zero_state}
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if torch.is_complex(param):
                raise RuntimeError(f"{type(self).__name__} does not support complex parameters")
            state = self.state[param]
            for name, tensors in slots.items():
                if name not in state:
                    state[name] = torch.zeros_like(param, memory_format=torch.preserve_format)
                tensors.append(state[name])
            params.append(param)
            grads.append(param.grad)
        return (params, grads, *slots.values())

    def _kernel_options(self, group: dict[str, Any]) -> dict[str, Any]:
        """The kernel's keywords for one param group: by default its config fields.

        Args:
            group: one of ``self.param_groups``.

        Returns:
            Keyword arguments of the kernel.
        """
        return {field.name: group[field.name] for field in attrs.fields(self.config_class)}

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimization step with the chosen kernel.

        Args:
            closure: re-evaluates the model and returns the loss (optional).

        Returns:
            The closure's loss, or None.
        """
        self._take_measured_choice()
        loss = closure_loss(closure)
        state_step = self._state_kernel_step if self.state_kernel is not None else None
        step_in_state_precision(
            self,
            self._kernel_step,
            self.second_moments,
            state_step,
            self.linear_slots,
            self.low_rank_slots,
        )
        return loss

    def _state_kernel_scalars(self, group: dict[str, Any]) -> Mapping[str, float] | None:
        """The scalars :attr:`state_kernel` reads for ``group``; None declines the C step.

        Override it with :attr:`state_kernel` (the base has no scalars to give).

        Args:
            group: one of ``self.param_groups``.
        """
        return None

    def _state_kernel_step(
        self, optimizer: torch.optim.Optimizer, group: dict[str, Any], param: torch.Tensor
    ) -> bool:
        """Step ``param`` on its stored state by :attr:`state_kernel`; False changes nothing.

        It applies with ``impl="fused"`` (``loop`` and ``foreach`` keep the
        kernels' own arithmetic on the decoded state), a float32 CPU
        parameter with a dense gradient, every slot already stored in the
        group's ``state_precision`` (otherwise the decoding path converts
        it), and scalars from :meth:`_state_kernel_scalars`.
        """
        source = self.state_kernel
        if source is None or self._impl != "fused" or torch.compiler.is_compiling():
            return False
        state = self.state.get(param)
        slots = [state.get(name) for name in source.slots] if state else []
        grad = param.grad
        scalars = self._state_kernel_scalars(group)
        kernel = state_kernel_or_none(source) if scalars is not None else None
        precision = group_precision(group)
        if kernel is None or grad is None or not kernel.applies(param, grad, slots, precision):
            return False
        kernel.step(param, grad, slots, scalars)  # type: ignore[arg-type]  # applies() checked them
        return True

    def _kernel_step(self) -> None:
        """The chosen kernel over every group of ``self.param_groups``."""
        kernel = self.implementations[self._impl]
        for group in self.param_groups:
            tensors = self._group_tensors(group)
            if tensors and tensors[0]:
                kernel(*tensors, **self._kernel_options(group))
