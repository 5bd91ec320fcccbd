"""Which parameters Muon takes, which go to the auxiliary AdamW, and why.

Muon is for the hidden weight matrices of a network. Embeddings and output
heads are matrices too, but are trained better (and by the Muon authors) with
AdamW, as are all 1-D and scalar parameters. Rules, first match wins:

1. ``use_muon`` given (top level or in a param-group dict): as given.
2. ``force_aux`` / ``force_muon`` globs on the full parameter name.
3. Fewer than 2 dimensions: AdamW.
4. With ``model=``: ``nn.Embedding``/``nn.EmbeddingBag`` weights, and the
   last ``nn.Linear`` whose ``out_features`` equals an embedding's
   ``num_embeddings`` (or whose weight is tied to one): AdamW.
5. Name globs (``aux_patterns``) on the module name or attribute name: AdamW.
6. Everything else (matrices, conv kernels): Muon.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence

import attrs
from torch import Tensor, nn

from optiplug import ParameterRoute, Routing
from optiplug.errors import HyperparameterError

from .config import MuonConfig

__all__ = [
    "Decision",
    "ModelInfo",
    "ParameterRoute",
    "Routing",
    "decide",
    "model_info",
    "model_roles",
]

_EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)


@attrs.frozen
class Decision:
    """Where one parameter goes and why.

    Attributes:
        use_muon: True for Muon, False for the auxiliary AdamW.
        reason: a short human-readable explanation.
    """

    use_muon: bool
    reason: str


def model_roles(model: nn.Module) -> dict[int, str]:
    """Embedding and output-head weights of ``model``, by tensor id, with the reason.

    The output head is an ``nn.Linear`` whose weight is tied to an embedding;
    failing that, the last ``nn.Linear`` whose ``out_features`` equals the
    largest embedding's ``num_embeddings`` (the vocabulary; position
    embeddings are smaller and often equal to a hidden width).

    Args:
        model: the module the parameters come from.

    Returns:
        ``id(weight) -> reason`` for each embedding weight and the output head.
    """
    roles: dict[int, str] = {}
    vocab = 0
    for name, module in model.named_modules():
        if isinstance(module, _EMBEDDINGS):
            roles[id(module.weight)] = f"embedding ({type(module).__name__} '{name}')"
            vocab = max(vocab, module.num_embeddings)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    tied = [(n, m) for n, m in linears if id(m.weight) in roles]
    for name, module in tied:
        roles[id(module.weight)] += f", tied to output head '{name}'"
    heads = [(n, m) for n, m in linears if m.out_features == vocab]
    if not tied and heads:
        name, module = heads[-1]
        roles[id(module.weight)] = (
            f"output head (last nn.Linear '{name}' with out_features={vocab}"
            " = the embedding's num_embeddings)"
        )
    return roles


def _matches(name: str, patterns: Sequence[str]) -> str | None:
    lowered = name.lower()
    return next((p for p in patterns if fnmatch.fnmatchcase(lowered, p.lower())), None)


def _short_names(name: str) -> list[str]:
    """The module name (last component before the attribute) and the attribute name."""
    parts = name.split(".")
    return parts[-2:] if len(parts) > 1 else parts


def _by_name(name: str, config: MuonConfig) -> Decision | None:
    if (glob := _matches(name, config.force_aux)) is not None:
        return Decision(False, f"name matches force_aux {glob!r}")
    if (glob := _matches(name, config.force_muon)) is not None:
        return Decision(True, f"name matches force_muon {glob!r}")
    return None


def _by_role(
    name: str | None, param: Tensor, roles: dict[int, str], config: MuonConfig
) -> Decision:
    if param.ndim < 2:
        return Decision(False, "scalar" if param.ndim == 0 else "not a matrix (1-D)")
    if id(param) in roles:
        return Decision(False, roles[id(param)])
    for short in _short_names(name) if name else ():
        if (glob := _matches(short, config.aux_patterns)) is not None:
            return Decision(False, f"embedding/head by name: {short!r} matches {glob!r}")
    if param.ndim > 2:
        flat = f"{param.shape[0]}x{math.prod(param.shape[1:])}"  # global shape for a DTensor
        return Decision(True, f"{param.ndim}-D weight, orthogonalised as {flat}")
    return Decision(True, "hidden matrix")


def decide(
    name: str | None, param: Tensor, roles: dict[int, str], config: MuonConfig, forced: bool | None
) -> Decision:
    """Route one parameter (rules in the module docstring).

    Args:
        name: its name, or None when unknown.
        param: the tensor.
        roles: :func:`model_roles` of the model, or ``{}``.
        config: the validated hyperparameters (routing options).
        forced: the ``use_muon`` in force for its group, if any.

    Returns:
        The :class:`Decision`.

    Raises:
        HyperparameterError: a parameter forced to Muon is not a matrix, or
            one would go to AdamW while ``aux`` is None.
    """
    if forced is not None:
        decision = Decision(forced, f"use_muon={forced} given")
    else:
        decision = (_by_name(name, config) if name else None) or _by_role(
            name, param, roles, config
        )
    label = name or "(unnamed)"
    if decision.use_muon and param.ndim < 2:
        raise HyperparameterError(
            "use_muon",
            True,
            f"parameter {label!r} has shape {tuple(param.shape)}; Muon needs a matrix (ndim >= 2)",
            algorithm="muon",
        )
    if not decision.use_muon and config.aux is None:
        raise HyperparameterError(
            "aux",
            None,
            f"parameter {label!r} (shape {tuple(param.shape)}) is not for Muon "
            f"({decision.reason}) and there is no auxiliary optimizer; pass aux='adamw' or "
            "leave it out",
            algorithm="muon",
        )
    return decision


@attrs.frozen
class ModelInfo:
    """What the optional ``model=`` tells the router.

    Attributes:
        roles: ``id(weight) -> reason`` for embeddings and the output head.
        names: ``id(parameter) -> name`` (to name unnamed parameters).
    """

    roles: dict[int, str] = attrs.field(factory=dict)
    names: dict[int, str] = attrs.field(factory=dict)


def model_info(model: nn.Module | None) -> ModelInfo:
    """Roles and names of ``model``'s parameters (empty without a model)."""
    if model is None:
        return ModelInfo()
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=True)}
    return ModelInfo(model_roles(model), names)
