"""optiplug optimizers in the Hugging Face ``Trainer``.

The ``Trainer`` builds its optimizer from ``optimizer_cls_and_kwargs=(cls,
kwargs)``: an optimizer class is called with HF's param groups, anything else
as ``cls()(model, **kwargs)``. This module gives the second form for any
registered algorithm, so the optimizer sees ``model.named_parameters()``
(names reach routing: Muon's embeddings and head go to its AdamW) and
``model=`` when the algorithm takes it::

    from optiplug.integrations.transformers import from_training_args, optimizer_cls_and_kwargs

    Trainer(model, args, optimizer_cls_and_kwargs=optimizer_cls_and_kwargs("muon", lr=0.02))
    Trainer(model, args, optimizer_cls_and_kwargs=from_training_args(args))  # args.optim

The Trainer keeps everything else: its lr scheduler, and saving and loading
the optimizer's ``state_dict`` in checkpoints. Weight decay follows the
Trainer's rule: biases and normalisation weights get none.

Importing this module imports torch and transformers; ``import optiplug``
never imports it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch
from torch import nn
from transformers import TrainingArguments

from .. import _api
from .._core.create import OptimizerFactory
from .._core.registry import Registry
from ..errors import HyperparameterError, UnknownOptimizerError

__all__ = [
    "HF_OPTIM_NAMES",
    "TrainerOptimizer",
    "decay_parameter_names",
    "from_training_args",
    "optimizer_cls_and_kwargs",
]

HF_OPTIM_NAMES: Mapping[str, tuple[str, str | None]] = {
    "adamw_torch": ("adamw", None),
    "adamw_torch_fused": ("adamw", "fused"),
    "sgd": ("sgd", None),
    "lion_32bit": ("lion", None),
    "lion_8bit": ("lion", None),
    "paged_lion_32bit": ("lion", None),
    "paged_lion_8bit": ("lion", None),
    "adamw_8bit": ("adamw", None),
    "adamw_bnb_8bit": ("adamw", None),
    "paged_adamw_32bit": ("adamw", None),
    "paged_adamw_8bit": ("adamw", None),
}
"""``TrainingArguments.optim`` -> (optiplug algorithm, forced implementation or None).

The bitsandbytes names (``*_8bit``, ``paged_*``) map to the plain algorithm,
with a warning: optiplug keeps optimizer state in 32 bits (the parameters'
dtype), unpaged.
"""

_UNSUPPORTED: Mapping[str, str] = {
    "adafactor": "optiplug has no Adafactor; use optim='adamw_torch' or an optiplug "
    "algorithm through optimizer_cls_and_kwargs()",
}

_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")
"""Parameter names (lower-cased) the Trainer exempts from weight decay."""


def decay_parameter_names(model: nn.Module) -> set[str]:
    """The parameters the Trainer applies weight decay to (``Trainer.get_decay_parameter_names``).

    All but those inside an ``nn.LayerNorm`` and those whose lower-cased name
    contains ``bias``, ``layernorm``, ``rmsnorm`` or a ``norm``/``*_norm``
    component.
    """
    norms = [prefix + "." for prefix, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    return {
        name
        for name, _ in model.named_parameters()
        if not _NO_DECAY.search(name.lower()) and not any(name.startswith(n) for n in norms)
    }


@attrs.frozen
class TrainerOptimizer:
    """The first element of ``optimizer_cls_and_kwargs``: ``TrainerOptimizer(f)()(model, **kw)``.

    The Trainer calls it with no arguments, then calls the result with the
    model and the (possibly empty) keywords. Build one with
    :func:`optimizer_cls_and_kwargs` or :func:`from_training_args`.

    Attributes:
        factory: the recipe: algorithm, hyperparameters, forced
            implementation, provider and registry.
    """

    factory: OptimizerFactory

    def __call__(self) -> Callable[..., torch.optim.Optimizer]:
        """Return :meth:`build` (the Trainer instantiates "the class" first)."""
        return self.build

    def build(self, model: nn.Module, **hparams: Any) -> torch.optim.Optimizer:
        """Create the optimizer over ``model``'s trainable, named parameters.

        Parameters are passed as ``(name, tensor)`` pairs, in two param
        groups when a ``weight_decay`` applies (the Trainer's decay
        parameters with it, the rest with 0.0); the algorithm also gets
        ``model=`` when it takes that hyperparameter (``muon``).

        Args:
            model: the module being trained.
            **hparams: hyperparameters overriding the factory's.

        Returns:
            The optimizer.
        """
        recipe = self.factory
        registry = recipe.registry if isinstance(recipe.registry, Registry) else None
        registry = registry if registry is not None else _api.default_registry()
        merged = {**recipe.hparams, **hparams}
        spec = registry.spec(recipe.name, provider=recipe.provider)
        accepted = {h.name for h in spec.hyperparameters}
        if "model" in accepted and merged.get("model") is None:
            merged["model"] = model
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        weight_decay = merged.get("weight_decay", 0.0) if "weight_decay" in accepted else 0.0
        params: list[Any] = named
        if weight_decay:
            decay = decay_parameter_names(model)
            params = [
                {"params": [(n, p) for n, p in named if n in decay], "weight_decay": weight_decay},
                {"params": [(n, p) for n, p in named if n not in decay], "weight_decay": 0.0},
            ]
            params = [group for group in params if group["params"]]
        return registry.create(
            recipe.name, params, impl=recipe.impl, provider=recipe.provider, **merged
        )


def optimizer_cls_and_kwargs(
    name: str | OptimizerFactory,
    *,
    impl: str | None = None,
    provider: str | None = None,
    registry: Registry | None = None,
    **hparams: Any,
) -> tuple[TrainerOptimizer, dict[str, Any]]:
    """What ``Trainer(optimizer_cls_and_kwargs=...)`` takes, for any optiplug algorithm.

    Args:
        name: an algorithm name, or a ready :class:`~optiplug.OptimizerFactory`
            (such as an ``AutoOptimizer`` :class:`~optiplug.Selection`), used
            as is (then no other argument may be given).
        impl: implementation to force, or None to choose.
        provider: plugin or distribution that must provide ``name``.
        registry: where to look ``name`` up; the default registry when None.
        **hparams: hyperparameters; the Trainer's ``learning_rate`` and
            ``weight_decay`` are *not* read (give ``lr=`` here, or use
            :func:`from_training_args`).

    Returns:
        ``(TrainerOptimizer, {})``: keywords the caller adds to the dict
        override the factory's hyperparameters.

    Raises:
        UnknownOptimizerError: nothing provides ``name``.
        HyperparameterError: a bad hyperparameter (checked now, not at ``train()``).
    """
    if isinstance(name, OptimizerFactory):
        if impl is not None or provider is not None or registry is not None or hparams:
            raise TypeError("give either a factory or a name with its arguments, not both")
        return TrainerOptimizer(name), {}
    found = registry if registry is not None else _api.default_registry()
    return TrainerOptimizer(found.factory(name, impl=impl, provider=provider, **hparams)), {}


def from_training_args(
    args: TrainingArguments, *, registry: Registry | None = None, **overrides: Any
) -> tuple[TrainerOptimizer, dict[str, Any]]:
    """Translate ``args.optim`` and its hyperparameters to an optiplug optimizer.

    ``learning_rate``, ``weight_decay``, ``adam_beta1``/``adam_beta2`` (as
    ``betas``) and ``adam_epsilon`` (as ``eps``) are passed to the algorithm
    when it takes them (``lion`` takes no ``eps``). See :data:`HF_OPTIM_NAMES`
    for the names understood.

    Args:
        args: the Trainer's arguments.
        registry: where to look the algorithm up; the default registry when None.
        **overrides: hyperparameters replacing those read from ``args``.

    Returns:
        What ``Trainer(optimizer_cls_and_kwargs=...)`` takes.

    Raises:
        UnknownOptimizerError: ``args.optim`` has no optiplug counterpart
            (``adafactor``, ``adagrad``, GaLore...), with the names that do.
        HyperparameterError: ``args.optim_args`` is set (give the keywords as
            ``overrides`` instead), or a bad hyperparameter.
    """
    optim = str(getattr(args.optim, "value", args.optim))
    if optim not in HF_OPTIM_NAMES:
        notes = [_UNSUPPORTED.get(optim, "optiplug has no counterpart for it.")]
        error = UnknownOptimizerError(optim, list(HF_OPTIM_NAMES), notes)
        error.message = f"TrainingArguments.optim={optim!r} is not supported: " + error.message
        raise error
    if args.optim_args:
        raise HyperparameterError(
            "optim_args",
            args.optim_args,
            "TrainingArguments.optim_args is not read by optiplug: pass those "
            "hyperparameters as keywords to from_training_args()",
        )
    name, impl = HF_OPTIM_NAMES[optim]
    if "8bit" in optim or optim.startswith("paged_"):
        warnings.warn(
            f"TrainingArguments.optim={optim!r}: optiplug's {name} keeps its state in 32 bits "
            "(the parameters' dtype), unpaged; bitsandbytes' 8-bit/paged state is not used",
            UserWarning,
            stacklevel=2,
        )
    found = registry if registry is not None else _api.default_registry()
    offered = {
        "lr": args.learning_rate,
        "weight_decay": args.weight_decay,
        "betas": (args.adam_beta1, args.adam_beta2),
        "eps": args.adam_epsilon,
    }
    accepted = {h.name for h in found.spec(name).hyperparameters}
    hparams = {key: value for key, value in offered.items() if key in accepted}
    return optimizer_cls_and_kwargs(name, impl=impl, registry=found, **{**hparams, **overrides})
