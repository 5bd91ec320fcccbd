"""Param groups for weight-decay exclusion (``no_decay``) and layer-wise lr decay (``layer_decay``).

:func:`param_groups` turns any ``params`` form (an ``nn.Module`` too) into
param-group dicts: parameters that should not be decayed (norm weights,
biases, embeddings, other 1-D tensors, the names the model's own
``no_weight_decay()`` lists, or names matching the user's globs) get weight
decay 0, and with ``layer_decay`` every parameter's learning rate is scaled
by ``layer_decay ** (num_layers - layer_id)``, the layer ids read from the
model's ``group_matcher()`` where it has one (timm's conventions, the same
groups as ``timm.optim.param_groups_layer_decay``). ``optiplug.create``
calls it for every algorithm when ``no_decay``/``layer_decay`` is given;
composite algorithms (``multi``) get the keywords and apply them per route.
See ``docs/param_groups.md``.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ..errors import HyperparameterError
from .params import named_param_groups
from .record import record_of
from .routing import ParameterRoute, Routing

__all__ = [
    "GROUPING_KEYWORDS",
    "LAYER_PATTERN",
    "NAME_HINTS",
    "NO_DECAY_AUTO",
    "ParamPlan",
    "count_layers",
    "layer_id",
    "param_groups",
    "param_groups_report",
    "build_groups",
    "check_grouping",
    "module_params",
    "plan_groups",
]

NO_DECAY_AUTO = "auto"
"""``no_decay="auto"``: the model's ``no_weight_decay()`` names, norms, biases, embeddings and
1-D parameters get weight decay 0."""

GROUPING_KEYWORDS = ("no_decay", "layer_decay", "num_layers")
"""Keywords of ``optiplug.create`` that build param groups (never passed to a plain factory)."""

LAYER_PATTERN = re.compile(r"(?:^|\.)(?:h|layers?|blocks?|stages?|resblocks)\.(\d+)(?:\.|$)")
"""A transformer block index in a parameter name: ``h.3.``, ``layers.3.``, ``blocks.3.``..."""

NAME_HINTS = {
    "norm": "norm",
    "ln_": "norm",
    "embed": "embedding",
    "wte": "embedding",
    "wpe": "embedding",
}
"""Name fragments (lower case) -> role, used only when no module tells the parameter's role."""

_LAYER0_HINTS = ("embed", "wte", "wpe", "tok_", "pos_", "cls_token", "stem")
"""Name fragments of parameters that come before the first block (layer 0)."""

_MATCH_PREVIOUS = 99999.0
"""A ``group_matcher()`` key ending in this joins the layer before it (timm's ``MATCH_PREV_GROUP``)."""

_Key = tuple[float, ...]
_Rule = tuple["re.Pattern[str]", int, _Key, str]
"""A compiled ``group_matcher()`` entry: (regex, group ordinal, suffix, group name)."""


@attrs.frozen
class ParamPlan:
    """What the grouping decided for one parameter.

    Attributes:
        name: its name (None when unnamed).
        tensor: the parameter.
        group: index of the input param group it came from.
        decay: False when it gets weight decay 0.
        layer: its layer id (0 = embeddings, i + 1 = block i, ``num_layers`` =
            head), or None without ``layer_decay``.
        lr_scale: the factor applied to its group's learning rates.
        reason: which rule decided, e.g. ``"no decay: norm (LayerNorm 'ln_f')"``.
    """

    name: str | None
    tensor: Any = attrs.field(eq=False, repr=False)
    group: int
    decay: bool
    layer: int | None
    lr_scale: float
    reason: str


def _error(field: str, value: Any, reason: str, algorithm: str | None) -> HyperparameterError:
    return HyperparameterError(field, value, reason, algorithm=algorithm)


def _patterns(no_decay: Any, algorithm: str | None) -> tuple[bool, tuple[str, ...]]:
    """``(auto rules on, user globs)`` from a ``no_decay`` value.

    Raises:
        HyperparameterError: anything but None, a bool, ``"auto"`` or a list of strings.
    """
    if no_decay is None or no_decay is False:
        return False, ()
    if no_decay is True:
        return True, ()
    if isinstance(no_decay, str):
        if no_decay.strip().lower() == NO_DECAY_AUTO:
            return True, ()
        raise _error(
            "no_decay",
            no_decay,
            "must be 'auto', a list of globs on parameter names (may include 'auto'), or None",
            algorithm,
        )
    if not isinstance(no_decay, Iterable) or isinstance(no_decay, Mapping):
        raise _error("no_decay", no_decay, "must be 'auto', a list of globs, or None", algorithm)
    items = list(no_decay)
    if not all(isinstance(item, str) for item in items):
        raise _error("no_decay", items, "every pattern must be a string", algorithm)
    auto = any(item.strip().lower() == NO_DECAY_AUTO for item in items)
    return auto, tuple(item for item in items if item.strip().lower() != NO_DECAY_AUTO)


def _check_layer_decay(
    layer_decay: Any, num_layers: Any, algorithm: str | None
) -> tuple[float | None, int | None]:
    if layer_decay is not None:
        if (
            isinstance(layer_decay, bool)
            or not isinstance(layer_decay, (int, float))
            or not 0 < layer_decay <= 1
        ):
            raise _error(
                "layer_decay", layer_decay, "must be a number in (0, 1], or None", algorithm
            )
        layer_decay = float(layer_decay)
    if num_layers is not None and (
        isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1
    ):
        raise _error("num_layers", num_layers, "must be an integer >= 1, or None", algorithm)
    return layer_decay, num_layers


def check_grouping(hparams: Mapping[str, Any], algorithm: str | None = None) -> None:
    """Validate the grouping keywords in ``hparams`` (the others are ignored).

    Raises:
        HyperparameterError: a bad ``no_decay``, ``layer_decay`` or ``num_layers``.
    """
    _patterns(hparams.get("no_decay"), algorithm)
    _check_layer_decay(hparams.get("layer_decay"), hparams.get("num_layers"), algorithm)


def block_index(name: str | None) -> int | None:
    """The block index in ``name`` (``"h.3.attn.weight"`` -> 3), or None."""
    if name is None:
        return None
    found = LAYER_PATTERN.search(name)
    return int(found.group(1)) if found else None


def count_layers(names: Iterable[str | None]) -> int:
    """``num_layers`` for these parameter names: the number of blocks + 1.

    Layer ids run from 0 (embeddings) through ``i + 1`` (block ``i``) to
    ``num_layers`` (the head and everything after the blocks).

    Args:
        names: every parameter name of the model (None entries are skipped).

    Returns:
        ``max block index + 2``, or 1 when no name has a block index.
    """
    indices = [i for i in map(block_index, names) if i is not None]
    return max(indices) + 2 if indices else 1


def layer_id(name: str | None, num_layers: int, *, embedding: bool = False) -> tuple[int, str]:
    """The layer id of parameter ``name`` and the rule that decided.

    Args:
        name: the parameter's full name.
        num_layers: see :func:`count_layers`.
        embedding: the parameter is known (from its module) to be an embedding.

    Returns:
        ``(layer id, reason)``: block ``i`` -> ``i + 1``; embeddings and
        names with ``embed``/``wte``/``wpe``/``tok_``/``pos_``/``cls_token``/
        ``stem`` -> 0; anything else (final norm, head, pooler) -> ``num_layers``.
    """
    index = block_index(name)
    if index is not None:
        return min(index + 1, num_layers), f"block {index}"
    if embedding:
        return 0, "embedding"
    lowered = (name or "").lower()
    hint = next((h for h in _LAYER0_HINTS if h in lowered), None)
    if hint is not None:
        return 0, f"name contains {hint!r}"
    return num_layers, "after the blocks (head)"


def _owners(model: Any) -> dict[int, tuple[str, Any, str, str]]:
    """``id(param) -> (module name, module, attribute, full name)`` of ``model`` (first owner wins)."""
    owners: dict[int, tuple[str, Any, str, str]] = {}
    for module_name, module in model.named_modules():
        for attribute, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{attribute}" if module_name else attribute
            owners.setdefault(id(param), (module_name, module, attribute, full))
    return owners


def _module_role(module: Any) -> str | None:
    """``"norm"``/``"embedding"`` by module type (class name as a fallback for norms)."""
    from torch import nn  # deferred: imports torch
    from torch.nn.modules import batchnorm, normalization  # deferred: imports torch

    norms = tuple(
        value
        for value in vars(normalization).values()
        if isinstance(value, type)
        and issubclass(value, nn.Module)
        and value.__module__ == normalization.__name__
    )
    if isinstance(module, (*norms, batchnorm._NormBase)):
        return "norm"
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return "embedding"
    if "norm" in type(module).__name__.lower():
        return "norm by class name"
    return None


def _no_weight_decay_list(model: Any, algorithm: str | None) -> tuple[str, ...]:
    """The globs the model's own ``no_weight_decay()`` returns (timm's convention), sorted.

    Returns:
        ``()`` for no model, or a model without a ``no_weight_decay`` method.

    Raises:
        HyperparameterError: ``no_weight_decay()`` returned something other than names.
    """
    method = getattr(model, "no_weight_decay", None) if model is not None else None
    if not callable(method):
        return ()
    listed = method()
    names_given = isinstance(listed, Iterable) and not isinstance(listed, (str, bytes, Mapping))
    items = list(listed) if names_given else []
    if not names_given or not all(isinstance(item, str) for item in items):
        raise _error(
            "no_decay",
            listed,
            f"'auto' reads {type(model).__name__}.no_weight_decay(), "
            "which must return a collection of parameter names",
            algorithm,
        )
    return tuple(sorted(items))


@attrs.frozen
class _DecayRules:
    """What ``no_decay`` asks for: the ``"auto"`` rules, the user's globs, the model's list."""

    auto: bool
    globs: tuple[str, ...]
    listed: tuple[str, ...] = ()
    lister: str = ""


def _first_match(names: Sequence[str], patterns: Sequence[str]) -> str | None:
    return next((p for p in patterns if any(fnmatch.fnmatchcase(n, p) for n in names)), None)


def _decay_rule(
    name: str | None,
    param: Any,
    owner: tuple[str, Any, str, str] | None,
    rules: _DecayRules,
) -> tuple[bool, str, bool]:
    """``(decay, reason, is embedding)`` for one parameter: the first rule that applies wins."""
    role = _module_role(owner[1]) if owner is not None else None
    embedding = role == "embedding"
    glob = _first_match([name] if name is not None else [], rules.globs)
    if glob is not None:
        return False, f"no decay: name matches {glob!r}", embedding
    if not rules.auto:
        return True, "decay", embedding
    names = [n for n in (name, owner[3] if owner is not None else None) if n is not None]
    listed = _first_match(names, rules.listed)
    if listed is not None:
        return False, f"no decay: {rules.lister}.no_weight_decay() lists {listed!r}", embedding
    decay, reason, hinted = _auto_rule(name, param, owner, role)
    return decay, reason, embedding or hinted


def _auto_rule(
    name: str | None, param: Any, owner: tuple[str, Any, str, str] | None, role: str | None
) -> tuple[bool, str, bool]:
    """``"auto"`` by module type, else by name (matrices and vectors only), else by shape."""
    if owner is not None:
        module_name, module, attribute, _ = owner
        where = f"{type(module).__name__} '{module_name}'"
        if role is not None:
            return False, f"no decay: {role} ({where})", False
        if attribute == "bias":
            return False, f"no decay: bias ({where})", False
    elif name is not None:
        lowered = name.lower()
        if lowered.rsplit(".", 1)[-1] == "bias":
            return False, "no decay: bias (by name)", False
        hint = next((h for h in NAME_HINTS if h in lowered), None)
        if hint is not None and param.ndim <= 2:
            role = NAME_HINTS[hint]
            return False, f"no decay: {role} (name contains {hint!r})", role == "embedding"
    if param.ndim < 2:
        return False, f"no decay: {'scalar' if param.ndim == 0 else '1-D'}", False
    if param.ndim > 2:
        return True, f"decay: {param.ndim}-D kernel", False
    return True, "decay: matrix", False


def _matcher_error(model: Any, algorithm: str | None) -> Callable[[Any, str], HyperparameterError]:
    """A maker of the error for a bad ``group_matcher()`` entry of ``model``."""

    def fail(value: Any, reason: str) -> HyperparameterError:
        where = f"{type(model).__name__}.group_matcher()"
        return _error("layer_decay", value, f"layer ids come from {where}: {reason}", algorithm)

    return fail


def _matcher_rules(
    spec: Mapping[Any, Any], fail: Callable[[Any, str], HyperparameterError]
) -> list[_Rule]:
    """Compile a timm-style matcher dict: ``{group: regex | [(regex, suffix or None), ...] | None}``.

    Every group has its ordinal (its position in the dict, None entries
    counted); a pair's suffix (``(0,)``, ``(99999,)``) is appended to the key.
    """
    rules: list[_Rule] = []
    for ordinal, (group, entry) in enumerate(spec.items()):
        if entry is None:
            continue
        pairs = entry if isinstance(entry, (list, tuple)) else [(entry, None)]
        for pair in pairs:
            if not (
                isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)
            ):
                raise fail(pair, f"entry {group!r} must be a regex or a list of (regex, suffix)")
            suffix = pair[1] if pair[1] is not None else ()
            if not isinstance(suffix, (list, tuple)) or not all(_is_number(x) for x in suffix):
                raise fail(pair[1], f"a suffix in {group!r} must be a tuple of numbers or None")
            try:
                compiled = re.compile(pair[0])
            except re.error as exc:
                raise fail(pair[0], f"not a regex ({exc})") from exc
            rules.append((compiled, ordinal, tuple(float(x) for x in suffix), str(group)))
    return rules


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rule_key(
    name: str, rules: Sequence[_Rule], fail: Callable[[Any, str], HyperparameterError]
) -> tuple[_Key, str]:
    """``(sort key, group name)`` of ``name``: the first regex that matches at its start wins."""
    for compiled, ordinal, suffix, group in rules:
        found = compiled.match(name)
        if found is None:
            continue
        captured = found.groups()
        if not all(isinstance(c, str) and _is_float(c) for c in captured):
            raise fail(compiled.pattern, f"captured {captured!r} from {name!r}, not numbers")
        return (float(ordinal), *(float(c) for c in captured), *suffix), group
    return (math.inf,), "unmatched"


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _callable_key(
    name: str, matcher: Callable[[str], Any], fail: Callable[[Any, str], HyperparameterError]
) -> tuple[_Key, str]:
    """``(sort key, group name)`` of ``name`` from a matcher function (a number or numbers)."""
    value = matcher(name)
    parts = list(value) if isinstance(value, Iterable) else [value]
    if not parts or not all(_is_number(part) for part in parts):
        raise fail(value, f"returned {value!r} for {name!r}; it must return a number or numbers")
    return tuple(float(part) for part in parts), "matcher"


def _matcher_layers(model: Any, algorithm: str | None) -> dict[str, tuple[int, str]] | None:
    """``{parameter name: (layer id, group)}`` from ``model.group_matcher(coarse=False)``.

    timm's rules: every parameter gets a sort key (group ordinal, the regex's
    captured numbers, the suffix; unmatched -> infinity, the head); the sorted
    distinct keys are numbered 0, 1, 2..., and a key ending in 99999 shares
    the number of the key before it.

    Returns:
        None when the model has no ``group_matcher``.
    """
    method = getattr(model, "group_matcher", None) if model is not None else None
    if not callable(method):
        return None
    fail = _matcher_error(model, algorithm)
    spec = method(coarse=False)
    if isinstance(spec, Mapping):
        rules = _matcher_rules(spec, fail)
        keyed = {name: _rule_key(name, rules, fail) for name, _ in model.named_parameters()}
    elif callable(spec):
        keyed = {name: _callable_key(name, spec, fail) for name, _ in model.named_parameters()}
    else:
        raise fail(spec, "must return a dict of regexes or a function of the parameter name")
    ids: dict[_Key, int] = {}
    layer = -1
    for key in sorted({key for key, _ in keyed.values()}):
        if layer < 0 or key[-1] != _MATCH_PREVIOUS:
            layer += 1
        ids[key] = layer
    return {name: (ids[key], group) for name, (key, group) in keyed.items()}


@attrs.frozen
class _Depth:
    """The layers: ``num_layers`` (the head's id) and the ids ``group_matcher()`` gives, if any."""

    num_layers: int
    matched: Mapping[str, tuple[int, str]] | None = None

    def layer_of(self, names: Sequence[str], embedding: bool) -> tuple[int, str]:
        """``(layer id, reason)`` of the parameter called ``names`` (its name, its owner's name)."""
        if self.matched is None:
            return layer_id(names[0] if names else None, self.num_layers, embedding=embedding)
        for name in names:
            if name in self.matched:
                layer, group = self.matched[name]
                return layer, f"group_matcher() {group!r}"
        return self.num_layers, "not in group_matcher(): the last layer"


def _depth(
    names: Sequence[str | None],
    model: Any,
    layer_decay: float,
    num_layers: int | None,
    algorithm: str | None,
) -> _Depth:
    """The model's layers: from its ``group_matcher()``, else counted from the names.

    Raises:
        HyperparameterError: ``num_layers`` disagrees with ``group_matcher()``,
            or the layers cannot be counted (every parameter would be one layer).
    """
    what = f"model {type(model).__name__}" if model is not None else "the parameters (no model=)"
    matched = _matcher_layers(model, algorithm)
    if matched is not None:
        top = max((layer for layer, _ in matched.values()), default=0)
        if num_layers is not None and num_layers != top:
            reason = f"{what}'s group_matcher() gives {top} (the head's layer id)"
            raise _error("num_layers", num_layers, reason, algorithm)
        if top == 0:
            reason = f"{what}'s group_matcher() puts every parameter in one layer"
            raise _error("layer_decay", layer_decay, reason, algorithm)
        return _Depth(top, matched)
    if num_layers is not None:
        return _Depth(num_layers)
    everything = [*names, *(n for n, _ in model.named_parameters())] if model is not None else names
    counted = count_layers(everything)
    if counted == 1:
        reason = (
            f"cannot count the layers of {what}: it has no group_matcher() and no parameter "
            "name has a block index (h.N, layer.N, layers.N, blocks.N, stages.N, "
            "resblocks.N); pass num_layers= or a model with group_matcher()"
        )
        raise _error("layer_decay", layer_decay, reason, algorithm)
    return _Depth(counted)


def plan_groups(
    params: Any,
    *,
    model: Any = None,
    no_decay: Any = None,
    layer_decay: float | None = None,
    num_layers: int | None = None,
    algorithm: str | None = None,
) -> tuple[list[ParamPlan], list[dict[str, Any]], bool]:
    """Decide, per parameter, weight decay and layer (see :func:`param_groups`).

    Returns:
        ``(plans, the input groups' options, every parameter named)``.

    Raises:
        HyperparameterError: a bad keyword, ``layer_decay``/name patterns
            without parameter names (and no ``model=``), or layers that
            cannot be counted (see :func:`param_groups`).
    """
    auto, globs = _patterns(no_decay, algorithm)
    layer_decay, num_layers = _check_layer_decay(layer_decay, num_layers, algorithm)
    params, model = module_params(params, model)
    rules = _DecayRules(auto, globs)
    if auto and model is not None:
        rules = _DecayRules(
            auto, globs, _no_weight_decay_list(model, algorithm), type(model).__name__
        )
    groups = named_param_groups(params)
    owners = _owners(model) if model is not None else {}
    entries: list[tuple[str | None, Any, int]] = []
    for index, group in enumerate(groups):
        for name, tensor in group.params:
            owner = owners.get(id(tensor))
            entries.append(
                (name if name is not None else (owner[3] if owner else None), tensor, index)
            )
    named = all(name is not None for name, _, _ in entries)
    if not named and (globs or layer_decay is not None):
        keyword = "layer_decay" if layer_decay is not None else "no_decay"
        raise _error(
            keyword,
            layer_decay if layer_decay is not None else list(globs),
            "needs parameter names: pass model.named_parameters(), the module, or model=",
            algorithm,
        )
    depth = None
    if layer_decay is not None:
        depth = _depth([name for name, _, _ in entries], model, layer_decay, num_layers, algorithm)
    plans = []
    for name, tensor, index in entries:
        owner = owners.get(id(tensor))
        decay, reason, embedding = _decay_rule(name, tensor, owner, rules)
        layer, scale = None, 1.0
        if layer_decay is not None and depth is not None:
            names = [n for n in (name, owner[3] if owner else None) if n is not None]
            layer, why = depth.layer_of(names, embedding)
            scale = layer_decay ** (depth.num_layers - layer)
            reason += f"; layer {layer}/{depth.num_layers} ({why}), lr x{scale:.4g}"
        plans.append(ParamPlan(name, tensor, index, decay, layer, scale, reason))
    return plans, [group.options for group in groups], named


def module_params(params: Any, model: Any = None) -> tuple[list[Any], Any]:
    """``(params, model)``, with an ``nn.Module`` given as params replaced by its named parameters.

    Args:
        params: any ``params`` form, or an ``nn.Module``.
        model: the ``model=`` keyword, if any (it wins over a module given as params).

    Returns:
        ``(list of params, model or None)``.
    """
    import torch  # deferred: imports torch

    if isinstance(params, torch.nn.Module):
        module = params
        return list(module.named_parameters()), (model if model is not None else module)
    return list(params), model


def _scaled(value: Any, scale: float) -> Any:
    return value if scale == 1.0 else value * scale


def build_groups(
    plans: Sequence[ParamPlan],
    options: Sequence[Mapping[str, Any]],
    named: bool,
    *,
    hparams: Mapping[str, Any],
    lr_keys: Sequence[str],
    weight_decay_keys: Sequence[str],
    algorithm: str | None = None,
) -> list[dict[str, Any]]:
    """Param-group dicts from :func:`plan_groups` (groups with equal settings merged).

    A no-decay group sets every key of ``weight_decay_keys`` whose base value
    (the input group's, else ``hparams``') is not 0 to 0.0, or every one when
    no base is known; a layer scale multiplies every key of ``lr_keys`` that
    has a base value.

    Raises:
        HyperparameterError: a layer scale but no base learning rate.
    """
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for plan in plans:
        base = {**hparams, **options[plan.group]}
        settings = dict(options[plan.group])
        if not plan.decay:
            for key in weight_decay_keys:
                if base.get(key) is None or base[key] != 0:
                    settings[key] = 0.0
        if plan.lr_scale != 1.0:
            known = [key for key in lr_keys if base.get(key) is not None]
            if not known:
                raise _error(
                    "layer_decay",
                    plan.lr_scale,
                    f"needs a base learning rate ({', '.join(lr_keys)}) to scale",
                    algorithm,
                )
            settings.update({key: _scaled(base[key], plan.lr_scale) for key in known})
        group_key = (plan.group, repr(sorted(settings.items())))
        group = out.setdefault(group_key, {"params": [], **settings})
        group["params"].append((plan.name, plan.tensor) if named else plan.tensor)
    return list(out.values())


def param_groups(
    params: Any,
    *,
    model: Any = None,
    no_decay: Any = None,
    layer_decay: float | None = None,
    num_layers: int | None = None,
    hparams: Mapping[str, Any] | None = None,
    lr_keys: Sequence[str] = ("lr",),
    weight_decay_keys: Sequence[str] = ("weight_decay",),
) -> list[dict[str, Any]]:
    """Split ``params`` into param groups without weight decay and with layer-wise lr decay.

    ``optiplug.create(name, params, no_decay=..., layer_decay=...)`` calls
    this with the algorithm's hyperparameters; call it yourself to feed any
    ``torch.optim`` optimizer.

    ``no_decay="auto"`` rules, first match wins: with a module (``model=``,
    or ``params`` given as the module), a name its ``no_weight_decay()``
    lists (timm's convention; ``fnmatch`` globs) is excluded, a parameter
    of a ``torch.nn.modules.normalization`` layer or a ``_NormBase`` (batch
    and instance norms) is a norm, of ``nn.Embedding``/``nn.EmbeddingBag``
    an embedding, of a module whose class name contains ``Norm`` a norm,
    and an attribute named ``bias`` a bias; without one, the name decides
    (last component ``bias``; for tensors of at most 2 dimensions,
    ``norm``, ``ln_``, ``embed``, ``wte``, ``wpe`` anywhere). Anything else
    with fewer than 2 dimensions is "1-D"; the rest (matrices, conv
    kernels whatever their names) is decayed.

    ``layer_decay`` layer ids come from the model's ``group_matcher(coarse=
    False)`` where it has one (timm's rules, the same groups as
    ``timm.optim.param_groups_layer_decay``), else from block indices in
    the names (:func:`layer_id`).

    Args:
        params: tensors, ``(name, tensor)`` pairs, param-group dicts (split
            further, their settings kept), or an ``nn.Module``.
        model: the module the parameters come from, to tell norms and
            embeddings by module type, to read its ``no_weight_decay()`` and
            ``group_matcher()`` (and to name unnamed tensors).
        no_decay: ``"auto"``, a list of globs on parameter names
            (``fnmatch``, case-sensitive; may include ``"auto"``), or None.
        layer_decay: lr scale per layer: ``layer_decay ** (num_layers -
            layer_id)`` (layer 0 = embeddings, block ``i`` = ``i + 1``,
            ``num_layers`` = head); None for no scaling.
        num_layers: override of :func:`count_layers` of the names (with a
            ``group_matcher()``, it must equal the head's layer id).
        hparams: the optimizer's hyperparameters: the base values the group
            settings are computed from.
        lr_keys: learning-rate keys to scale (``("lr", "aux_lr")`` for muon).
        weight_decay_keys: weight-decay keys to zero.

    Returns:
        Param-group dicts, in first-appearance order; ``"params"`` holds
        ``(name, tensor)`` pairs when every parameter has a name.

    Raises:
        HyperparameterError: a bad keyword value, names needed but missing,
            ``layer_decay`` without a base ``lr`` in ``hparams``, layers that
            cannot be counted (no ``group_matcher()``, no block index in any
            name, no ``num_layers``), or a bad ``group_matcher()`` /
            ``no_weight_decay()`` result.
    """
    plans, options, named = plan_groups(
        params, model=model, no_decay=no_decay, layer_decay=layer_decay, num_layers=num_layers
    )
    return build_groups(
        plans,
        options,
        named,
        hparams=hparams or {},
        lr_keys=lr_keys,
        weight_decay_keys=weight_decay_keys,
    )


def _reasons_of(optimizer: Any) -> dict[str, str]:
    children = getattr(optimizer, "optimizers", None)
    found = [optimizer, *(children.values() if isinstance(children, Mapping) else ())]
    reasons: dict[str, str] = {}
    for each in found:
        record = record_of(each)
        reasons.update(record.grouping if record is not None else {})
    return reasons


def param_groups_report(optimizer: Any) -> Routing:
    """Who got which learning rate and weight decay, and why: a printable table.

    Works for any ``torch.optim.Optimizer``; for one with ``routing()``
    (``muon``, ``multi``) its rows are extended with the grouping reasons.

    Args:
        optimizer: the optimizer.

    Returns:
        A :class:`~optiplug.Routing` (``print()`` it; index it by parameter name).
    """
    reasons = _reasons_of(optimizer)
    routing = getattr(optimizer, "routing", None)
    if callable(routing):
        rows = [
            attrs.evolve(row, reason="; ".join(filter(None, (row.reason, reasons.get(row.name)))))
            for row in routing()
        ]
        return Routing(tuple(rows))
    record = record_of(optimizer)
    algorithm = record.algorithm if record is not None else type(optimizer).__name__
    rows, position = [], 0
    for index, group in enumerate(optimizer.param_groups):
        names = group.get("param_names") or [None] * len(group["params"])
        for name, param in zip(names, group["params"], strict=True):
            label = name if name is not None else f"#{position}"
            rows.append(
                ParameterRoute(
                    name=label,
                    shape=tuple(param.shape),
                    algorithm=algorithm,
                    reason=reasons.get(label, ""),
                    lr=float(group.get("lr", 0.0)),
                    weight_decay=float(group.get("weight_decay", 0.0)),
                    group=index,
                )
            )
            position += 1
    return Routing(tuple(rows))
