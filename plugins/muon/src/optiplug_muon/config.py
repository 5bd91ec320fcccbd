"""Hyperparameters and state layout of Muon with its auxiliary AdamW (torch-free)."""

from __future__ import annotations

import math
from typing import Any

import attrs

from optiplug import StateSlot
from optiplug.errors import HyperparameterError
from optiplug.validators import (
    betas,
    boolean,
    hyperparameter,
    learning_rate,
    non_negative,
    positive,
    positive_int,
    state_precision_field,
    unit_interval,
)

from .coefficients import NS_COEFFICIENTS, QUINTIC

__all__ = [
    "ADJUST_LR",
    "AUX_KEYS",
    "DEFAULT_AUX_PATTERNS",
    "MUON_KEYS",
    "MUON_STATE",
    "NORMUON_KEYS",
    "NORMUON_STATE",
    "NS_COEFFICIENTS",
    "NS_DTYPES",
    "NS_METHODS",
    "WEIGHT_DECAY_MODES",
    "MuonConfig",
    "NorMuonConfig",
    "ns_dtype_name",
]

ADJUST_LR = ("original", "match_rms_adamw", "original_last_two")
"""``original``: lr * sqrt(max(1, rows/cols)) of the matrix Muon orthogonalises (a conv
kernel flattened to out x in*kh*kw); ``match_rms_adamw``: lr * 0.2 * sqrt(max(rows,
cols)); ``original_last_two``: lr * sqrt(max(1, shape[-2]/shape[-1])) of the parameter
as it is, as Keller Jordan's reference code reads it (1.0 for a 64x3x3x3 kernel, where
``original`` gives 1.54; the same for a matrix)."""

NS_DTYPES = ("bfloat16", "float16", "float32", "float64")
"""Dtypes Newton-Schulz may run in (None picks per device)."""

NS_METHODS = ("auto", "standard", "gram")
"""How Newton-Schulz is computed: the standard iteration, its Gram form (same
iteration, fewer FLOPs for rectangular matrices), or per shape the cheaper one."""

WEIGHT_DECAY_MODES = ("decoupled", "cautious")
"""``decoupled``: ``p *= 1 - lr*wd`` everywhere; ``cautious``: only where the
update and the parameter have the same sign (arXiv 2510.12402)."""

DEFAULT_AUX_PATTERNS = (
    "*embed*",
    "wte",
    "wpe",
    "tok_emb*",
    "pos_emb*",
    "lm_head",
    "head",
    "output",
    "classifier",
)
"""Globs (case-insensitive) matched against a parameter's module name (the last
component before ``.weight``) and its own attribute name; a match sends it to AdamW."""

MUON_KEYS = (
    "lr",
    "momentum",
    "nesterov",
    "ns_steps",
    "ns_coefficients",
    "eps",
    "weight_decay",
    "weight_decay_mode",
    "adjust_lr",
    "ns_dtype",
    "ns_batch",
    "ns_method",
    "state_precision",
)
"""The keys of a Muon param group (besides ``params`` and ``use_muon``)."""

NORMUON_KEYS = (*MUON_KEYS, "beta2", "neuron_eps")
"""The keys of a NorMuon param group (besides ``params`` and ``use_muon``)."""

AUX_KEYS = {
    "lr": "aux_lr",
    "aux_betas": "aux_betas",
    "eps": "aux_eps",
    "weight_decay": "aux_weight_decay",
    "state_precision": "state_precision",
}
"""The keys of an auxiliary AdamW param group -> the config field they come from.

``lr``, ``eps`` and ``weight_decay`` use the common names (schedulers and tools
read them); the betas keep their config name, so every group key is a
MuonConfig field and a checkpoint may change it."""


def ns_dtype_name(value: Any) -> str | None:
    """Normalise an ``ns_dtype`` (None, ``"bfloat16"`` or ``torch.bfloat16``) to a name.

    Args:
        value: None (choose per device), a dtype name, or a ``torch.dtype``.

    Returns:
        None or one of :data:`NS_DTYPES`.

    Raises:
        HyperparameterError: not a supported floating dtype.
    """
    if value is None:
        return None
    name = str(value).removeprefix("torch.")
    if name not in NS_DTYPES:
        raise HyperparameterError(
            "ns_dtype", value, f"must be None or one of {', '.join(NS_DTYPES)}"
        )
    return name


def _finite_float(value: Any) -> bool:
    """An int or float (not a bool) that converts to a finite float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


_GRID = tuple(i / 64 for i in range(1, 65))


def _keeps_singular_values(a: float, b: float, c: float) -> bool:
    """Whether p(x) = ax + bx³ + cx⁵ maps (0, 1] into (0, 2) (sampled on 64 points).

    Newton-Schulz applies p to singular values normalised into (0, 1]; a
    polynomial leaving that range flips or blows them up (non-finite steps).
    """
    return all(0 < a * x + b * x**3 + c * x**5 < 2 for x in _GRID)


def _coefficients(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, str):
        if value not in NS_COEFFICIENTS:
            choices = " | ".join(repr(name) for name in NS_COEFFICIENTS)
            reason = f"must be one of {choices} or three finite numbers (a, b, c)"
            raise HyperparameterError(attribute.name, value, reason)
        return
    ok = isinstance(value, tuple) and len(value) == 3 and all(_finite_float(v) for v in value)
    if not ok:
        choices = " | ".join(repr(name) for name in NS_COEFFICIENTS)
        reason = f"must be three finite numbers (a, b, c) or one of {choices}"
        raise HyperparameterError(attribute.name, value, reason)
    if not _keeps_singular_values(*map(float, value)):
        reason = "ax + bx^3 + cx^5 must map (0, 1] into (0, 2), or Newton-Schulz diverges"
        raise HyperparameterError(attribute.name, value, reason)


def _one_of(*choices: str | None) -> Any:
    """Accept exactly one of ``choices`` (a string equal to one, or None if listed)."""

    def check(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        ok = value is None if value is None else isinstance(value, str) and value in choices
        if not ok or (value is None and None not in choices):
            raise HyperparameterError(attribute.name, value, f"must be one of {choices}")

    return check


def _ns_dtype(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    ns_dtype_name(value)


def _patterns(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise HyperparameterError(attribute.name, value, "must be a tuple of glob strings")


def _optional_bool(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise HyperparameterError(attribute.name, value, "must be None, True or False")


def _module(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not callable(getattr(value, "named_modules", None)):
        raise HyperparameterError(attribute.name, value, "must be a torch.nn.Module or None")


@attrs.frozen
class MuonConfig:
    """Muon hyperparameters, the auxiliary AdamW's, and the routing options.

    Muon: momentum ``m = momentum*m + (1-momentum)*g``; the update direction
    (``(1-momentum)*g + momentum*m`` with Nesterov, else ``m``) is
    orthogonalised by ``ns_steps`` quintic Newton-Schulz iterations and applied
    as ``p = p*(1 - lr*weight_decay) - adjusted_lr * O``.

    Attributes:
        lr: Muon's learning rate (before ``adjust_lr``).
        momentum: momentum factor in [0, 1).
        nesterov: use the Nesterov direction.
        ns_steps: Newton-Schulz iterations.
        ns_coefficients: (a, b, c) of the quintic iteration (the default is
            Jordan's, also named ``"quintic"``), or ``"polar_express"``: the
            per-iteration minimax-optimal schedule of arXiv 2505.16932 (see
            :mod:`optiplug_muon.coefficients`).
        eps: floor of the Frobenius norm the input is divided by.
        weight_decay: decoupled, with the unadjusted lr.
        weight_decay_mode: ``"decoupled"`` (``p *= 1 - lr*wd``) or
            ``"cautious"`` (only where the update and the parameter agree in
            sign, arXiv 2510.12402, as the modded-nanogpt speedrun does).
        adjust_lr: ``"original"``, ``"match_rms_adamw"`` or ``"original_last_two"``
            (see :data:`ADJUST_LR`).
        ns_dtype: dtype Newton-Schulz runs in; None = bfloat16 where the device
            has fast bf16 matmul, else float32.
        ns_batch: orthogonalise same-shape matrices in one batched matmul
            (keeps a persistent workspace of about twice their size in
            ns_dtype); None = per device: one at a time on CPU (measured
            faster there), batched elsewhere.
        ns_method: ``"standard"`` (X <- aX + (bA + cA²)X, as torch.optim.Muon),
            ``"gram"`` (the same iteration carried out on the Gram matrix, with
            restarts) or ``"auto"`` (per shape, whichever needs fewer FLOPs).
        aux: ``"adamw"`` (non-Muon parameters go to an auxiliary AdamW) or None
            (they are an error).
        aux_lr: the auxiliary AdamW's learning rate.
        aux_betas: its betas.
        aux_eps: its eps.
        aux_weight_decay: its decoupled weight decay.
        model: the module the parameters come from; enables detection of
            embeddings and output heads by module type.
        aux_patterns: name globs marking embeddings and heads (see
            :data:`DEFAULT_AUX_PATTERNS`); ``()`` disables name matching.
        force_muon: globs on full parameter names always sent to Muon.
        force_aux: globs on full parameter names always sent to AdamW.
        use_muon: None routes each parameter; True/False sends every parameter
            (of this param group, when given in a group dict) to Muon/AdamW.
        state_precision: how the momentum and the auxiliary AdamW's moments
            are stored: ``"fp32"`` (the parameter's dtype), ``"bf16"``,
            ``"int8"`` or ``"int4"`` (see ``optiplug.base.QuantizedState``;
            the momentum in int8/int4 takes the linear table, the AdamW
            moments the dynamic one).
    """

    lr: float = hyperparameter(0.02, learning_rate, "finite, >= 0")
    momentum: float = hyperparameter(0.95, unit_interval, "in [0, 1)")
    nesterov: bool = hyperparameter(True, boolean, "bool")
    ns_steps: int = hyperparameter(5, positive_int, "integer >= 1")
    ns_coefficients: tuple[float, float, float] | str = hyperparameter(
        QUINTIC, _coefficients, "three finite numbers | " + " | ".join(NS_COEFFICIENTS)
    )
    eps: float = hyperparameter(1e-7, positive, "> 0")
    weight_decay: float = hyperparameter(0.0, non_negative, ">= 0 (decoupled: p *= 1 - lr*wd)")
    weight_decay_mode: str = hyperparameter(
        "decoupled", _one_of(*WEIGHT_DECAY_MODES), " | ".join(WEIGHT_DECAY_MODES)
    )
    adjust_lr: str = hyperparameter("original", _one_of(*ADJUST_LR), " | ".join(ADJUST_LR))
    ns_dtype: object = hyperparameter(None, _ns_dtype, "None (auto) | " + " | ".join(NS_DTYPES))
    ns_batch: bool | None = hyperparameter(None, _optional_bool, "None (per device) | bool")
    ns_method: str = hyperparameter("auto", _one_of(*NS_METHODS), " | ".join(NS_METHODS))
    aux: str | None = hyperparameter("adamw", _one_of("adamw", None), "'adamw' | None")
    aux_lr: float = hyperparameter(3e-4, learning_rate, "finite, >= 0")
    aux_betas: tuple[float, float] = hyperparameter((0.9, 0.95), betas, "each in [0, 1)")
    aux_eps: float = hyperparameter(1e-10, positive, "> 0")
    aux_weight_decay: float = hyperparameter(0.0, non_negative, ">= 0")
    model: object = hyperparameter(None, _module, "torch.nn.Module | None")
    aux_patterns: tuple[str, ...] = hyperparameter(DEFAULT_AUX_PATTERNS, _patterns, "globs")
    force_muon: tuple[str, ...] = hyperparameter((), _patterns, "globs on parameter names")
    force_aux: tuple[str, ...] = hyperparameter((), _patterns, "globs on parameter names")
    use_muon: bool | None = hyperparameter(None, _optional_bool, "None | bool")
    state_precision: str = state_precision_field()


MUON_STATE = (
    StateSlot(
        "momentum_buffer",
        when="use_muon",
        description="Muon momentum (EMA of gradients), in Muon param groups",
    ),
    StateSlot(
        "step",
        shape="scalar",
        dtype="float32",
        when="aux_betas",
        constraints=("finite", "non_negative", "integral"),
        description="AdamW steps taken, in auxiliary AdamW groups (those with aux_betas)",
    ),
    StateSlot("exp_avg", when="aux_betas", description="AdamW first moment, in AdamW groups"),
    StateSlot(
        "exp_avg_sq",
        when="aux_betas",
        constraints=("finite", "non_negative"),
        description="AdamW second moment, in AdamW groups",
    ),
)
"""Muon groups (``use_muon`` true) keep ``momentum_buffer``; AdamW groups (which
have ``aux_betas`` and ``use_muon`` false) keep torch AdamW's ``step``, ``exp_avg``,
``exp_avg_sq``."""


@attrs.frozen
class NorMuonConfig(MuonConfig):
    """NorMuon's hyperparameters: Muon's (see :class:`MuonConfig`) plus the neuron-wise ones.

    NorMuon (Li, Liu, Liang, Chen, Zhao, "NorMuon: Making Muon more efficient
    and scalable", arXiv 2510.05491) divides each row (output neuron) of the
    orthogonalised update ``O`` by the square root of an EMA of that row's
    mean square, then rescales the whole update back to ``||O||_F``.

    Attributes:
        beta2: decay of the per-row second-moment EMA, in [0, 1).
        neuron_eps: added to the root of the second moment (and to the
            normalised update's Frobenius norm) before dividing.
    """

    beta2: float = hyperparameter(0.95, unit_interval, "in [0, 1)")
    neuron_eps: float = hyperparameter(1e-10, positive, "> 0")


NORMUON_STATE = (
    *MUON_STATE[:1],
    StateSlot(
        "second_momentum_buffer",
        when="use_muon",
        constraints=("finite", "non_negative"),
        description=(
            "NorMuon per-row EMA of the orthogonalised update's mean square, in NorMuon param "
            "groups; parameter-shaped (each row holds its neuron's value in every column)"
        ),
    ),
    *MUON_STATE[1:],
)
"""NorMuon groups keep ``momentum_buffer`` and ``second_momentum_buffer``; AdamW
groups keep torch AdamW's ``step``, ``exp_avg``, ``exp_avg_sq`` (as in :data:`MUON_STATE`)."""
