"""Hyperparameter validators for attrs config classes.

An algorithm's hyperparameters are an attrs class whose fields are declared
with :func:`hyperparameter`; constructing it validates every value and raises
:class:`~optiplug.errors.HyperparameterError` naming the field and value::

    @attrs.frozen
    class AcmeConfig:
        lr: float = hyperparameter(1e-3, learning_rate, "finite, >= 0")
        momentum: float = hyperparameter(0.9, unit_interval, "in [0, 1)")

``validate_hyperparameters`` runs such a class over user keywords (with a
did-you-mean for typos), or, for a plain torch optimizer registered without a
config class, checks the keywords against its signature and the well-known
names (``lr``, ``betas``, ``eps``, ``weight_decay``, ``momentum``).
"""

from __future__ import annotations

import inspect
import math
import numbers
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import attrs

from ._lazy import LazyCallable, LazyConfig, lazy_config, lazy_config_lookup
from .errors import HyperparameterError, closest_name

__all__ = [
    "STATE_PRECISIONS",
    "Hyperparameter",
    "LazyConfig",
    "betas",
    "betas_of",
    "boolean",
    "hyperparameter",
    "hyperparameters_of",
    "known_hyperparameters",
    "lazy_config",
    "lazy_config_lookup",
    "learning_rate",
    "non_negative",
    "positive",
    "positive_int",
    "reject_unknown",
    "state_precision",
    "state_precision_field",
    "unit_interval",
    "validate_hyperparameters",
]

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


class NamedField(Protocol):
    """What the validators here read of the field they check: its name.

    ``attrs.Attribute`` is one; so is the stand-in used when hyperparameters
    are checked without a config class.
    """

    @property
    def name(self) -> str: ...


_FieldCheck = Callable[[Any, NamedField, Any], None]


def _as_number(field: str, value: Any) -> float:
    """Return ``value`` as a float, accepting what torch's optimizers accept.

    That is: an int or float (numpy's real scalars included) and a 0-d real
    tensor with data. A bool, a complex or exotic number (``Fraction``,
    ``Decimal``), an int too large for a float, a meta or complex tensor and
    anything whose conversion fails raise :class:`HyperparameterError`.
    """
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise HyperparameterError(field, value, "must be a number, not a bool")
    tensor = _tensor_type()
    if tensor is not None and isinstance(value, tensor):
        return _tensor_number(field, value)
    plain = isinstance(value, (int, float)) or type(value).__module__ == "numpy"
    if not (plain and isinstance(value, numbers.Real)):
        raise HyperparameterError(field, value, "must be a real number or a 0-d tensor")
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError, ArithmeticError) as error:
        raise HyperparameterError(field, value, f"must be a finite number ({error})") from None


def _tensor_type() -> Any:
    """``torch.Tensor`` if torch is imported (a value cannot be a tensor otherwise)."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def _tensor_number(field: str, value: Any) -> float:
    if value.ndim != 0:
        raise HyperparameterError(field, value, "must be a real number or a 0-d tensor")
    if value.device.type == "meta":
        raise HyperparameterError(field, value, "must be a tensor with data (not on meta)")
    if value.dtype.is_complex or str(value.dtype) == "torch.bool":
        raise HyperparameterError(field, value, "must be a 0-d tensor of a real number dtype")
    try:
        return float(value.item())
    except (RuntimeError, ValueError, TypeError, OverflowError) as error:
        raise HyperparameterError(
            field, value, f"must be a readable 0-d tensor ({error})"
        ) from None


def _finite(field: str, value: Any) -> float:
    number = _as_number(field, value)
    if not math.isfinite(number):
        raise HyperparameterError(field, value, "must be finite")
    return number


def learning_rate(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a finite number (or 0-d tensor) >= 0."""
    if _finite(attribute.name, value) < 0:
        raise HyperparameterError(attribute.name, value, "must be >= 0")


def non_negative(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a finite number >= 0."""
    if _finite(attribute.name, value) < 0:
        raise HyperparameterError(attribute.name, value, "must be >= 0")


def positive(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a finite number > 0."""
    if _finite(attribute.name, value) <= 0:
        raise HyperparameterError(attribute.name, value, "must be > 0")


def unit_interval(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a finite number in [0, 1)."""
    number = _finite(attribute.name, value)
    if not 0.0 <= number < 1.0:
        raise HyperparameterError(attribute.name, value, "must be in [0, 1)")


def betas(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a tuple of betas, each in [0, 1), of the field's declared arity.

    The arity is the length of the field's default (``(0.98, 0.92, 0.99)``
    declares three, as Adan takes); without a tuple default, a pair.
    :func:`betas_of` fixes the arity explicitly.
    """
    _check_betas(attribute.name, value, _declared_arity(attribute))


def betas_of(arity: int) -> _FieldCheck:
    """A validator accepting ``arity`` betas, each in [0, 1).

    Args:
        arity: how many betas (2 for Adam, 3 for Adan...); at least 1.

    Returns:
        An attrs validator raising :class:`HyperparameterError`.

    Raises:
        ValueError: ``arity`` is not an integer >= 1.
    """
    if isinstance(arity, bool) or not isinstance(arity, int) or arity < 1:
        raise ValueError(f"betas_of: arity must be an integer >= 1, got {arity!r}")

    def check(_: Any, attribute: NamedField, value: Any) -> None:
        _check_betas(attribute.name, value, arity)

    check.__doc__ = f"Accept {arity} betas, each in [0, 1)."
    return check


def _declared_arity(attribute: NamedField) -> int:
    default = getattr(attribute, "default", None)
    return len(default) if isinstance(default, (tuple, list)) and default else 2


_ARITY_NAMES = {1: "a 1-tuple", 2: "a pair", 3: "a triple"}


def _check_betas(name: str, value: Any, arity: int) -> None:
    if not isinstance(value, (tuple, list)) or len(value) != arity:
        names = ", ".join(f"beta{i + 1}" for i in range(arity))
        shape = _ARITY_NAMES.get(arity, f"a tuple of {arity}")
        raise HyperparameterError(name, value, f"must be {shape} ({names})")
    tensor = _tensor_type()
    tensors = sum(tensor is not None and isinstance(beta, tensor) for beta in value)
    if 0 < tensors < arity or (tensors == 0 and not all(isinstance(b, float) for b in value)):
        reason = "the betas must all be floats or all 0-d tensors (as torch requires)"
        raise HyperparameterError(name, value, reason)
    for index, beta in enumerate(value):
        number = _finite(f"{name}[{index}]", beta)
        if not 0.0 <= number < 1.0:
            raise HyperparameterError(name, value, f"beta{index + 1} must be in [0, 1)")


def boolean(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept a bool only (not 0/1 or a string)."""
    if not isinstance(value, bool):
        raise HyperparameterError(attribute.name, value, "must be True or False")


def positive_int(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept an int >= 1 (not a bool)."""
    integral = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not integral or not 1 <= value < 2**63:
        raise HyperparameterError(attribute.name, value, "must be an integer >= 1 (and < 2**63)")


STATE_PRECISIONS = ("fp32", "bf16", "int8", "int4")
"""How an optimizer's per-element state may be stored: ``fp32`` (full: the
parameter's dtype, the default), ``bf16`` (stochastic rounding), ``int8``,
``int4`` (blockwise codes and scales); see ``optiplug.base.QuantizedState``."""


def state_precision(_: Any, attribute: NamedField, value: Any) -> None:
    """Accept one of :data:`STATE_PRECISIONS`."""
    if not isinstance(value, str) or value not in STATE_PRECISIONS:
        raise HyperparameterError(
            attribute.name, value, f"must be one of {', '.join(STATE_PRECISIONS)}"
        )


def state_precision_field() -> Any:
    """The ``state_precision`` hyperparameter of an algorithm whose kernels run on
    :func:`optiplug.base.step_in_state_precision` (default ``"fp32"``)."""
    return hyperparameter("fp32", state_precision, " | ".join(STATE_PRECISIONS))


def _to_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def hyperparameter(default: Any, validator: Validator, constraint: str) -> Any:
    """Declare one validated hyperparameter of an attrs config class.

    Args:
        default: the default value.
        validator: an attrs validator from this module (or your own raising
            :class:`~optiplug.errors.HyperparameterError`).
        constraint: human-readable constraint shown by ``optiplug show``.

    Returns:
        An ``attrs.field`` carrying the constraint in its metadata.
    """
    return attrs.field(
        default=default,
        validator=validator,
        converter=_to_tuple,
        metadata={"constraint": constraint},
    )


@attrs.frozen
class Hyperparameter:
    """One hyperparameter as ``optiplug show`` and ``optiplug.spec`` report it."""

    name: str
    default: Any
    constraint: str


_WELL_KNOWN: dict[str, tuple[_FieldCheck, str]] = {
    "lr": (learning_rate, "finite, >= 0"),
    "betas": (betas, "each in [0, 1)"),  # arity: the signature default's
    "eps": (positive, "> 0"),
    "weight_decay": (non_negative, ">= 0"),
    "momentum": (unit_interval, "in [0, 1)"),
    "dampening": (non_negative, ">= 0"),
}


def hyperparameters_of(
    config: type | None, factory: Callable[..., Any]
) -> tuple[Hyperparameter, ...]:
    """List the hyperparameters of an algorithm.

    Args:
        config: the attrs config class, or None.
        factory: the optimizer factory, used when there is no config class.

    Returns:
        One :class:`Hyperparameter` per field (config) or per keyword
        parameter after ``params`` (factory signature).
    """
    if config is not None:
        return tuple(
            Hyperparameter(f.name, f.default, f.metadata.get("constraint", ""))
            for f in attrs.fields(config)
        )
    found = []
    for parameter in _keyword_parameters(factory):
        default = None if parameter.default is inspect.Parameter.empty else parameter.default
        constraint = _WELL_KNOWN.get(parameter.name, (None, ""))[1]
        found.append(Hyperparameter(parameter.name, default, constraint))
    return tuple(found)


def _signature(factory: Callable[..., Any]) -> inspect.Signature:
    target = factory.resolve() if isinstance(factory, LazyCallable) else factory
    return inspect.signature(target)


def _keyword_parameters(factory: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        signature = _signature(factory)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = [p for p in signature.parameters.values() if p.kind in kinds]
    return [p for p in parameters if p.name not in {"self", "params"}]


def _accepts_any_keyword(factory: Callable[..., Any]) -> bool:
    try:
        parameters = _signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def reject_unknown(names: Iterable[str], known: Iterable[str], algorithm: str) -> None:
    """Raise for the first (sorted) name not in ``known``, with a did-you-mean.

    Args:
        names: the keywords given.
        known: the accepted keywords.
        algorithm: named in the message.

    Raises:
        HyperparameterError: naming the unknown keyword and the accepted ones.
    """
    known = set(known)
    for name in sorted(names):
        if name not in known:
            accepted = ", ".join(sorted(known)) or "none"
            suggestion = closest_name(name, known)
            hint = f"; did you mean {suggestion!r}?" if suggestion else ""
            raise HyperparameterError(
                name,
                "<unknown keyword>",
                f"unknown hyperparameter {name!r} for optimizer {algorithm}{hint} "
                f"(accepted: {accepted})",
                algorithm=algorithm,
                suggestion=suggestion,
            )


def known_hyperparameters(
    config: type | None = None, factory: Callable[..., Any] | None = None
) -> frozenset[str] | None:
    """The keywords :func:`validate_hyperparameters` accepts; None when it accepts any.

    Args:
        config: the algorithm's attrs config class, if it has one.
        factory: the optimizer factory (read by signature when no config).

    Returns:
        The config's fields, else the factory's named keywords; None for a
        factory that takes ``**kwargs`` or none given.
    """
    if config is not None:
        return frozenset(f.name for f in attrs.fields(config))
    if factory is None or _accepts_any_keyword(factory):
        return None
    return frozenset(p.name for p in _keyword_parameters(factory))


def validate_hyperparameters(
    algorithm: str,
    hparams: Mapping[str, Any],
    *,
    config: type | None = None,
    factory: Callable[..., Any] | None = None,
    extra: Iterable[str] = (),
    check_unknown: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> Any:
    """Validate user hyperparameters for ``algorithm``.

    Args:
        algorithm: name used in error messages.
        hparams: the keywords the user gave.
        config: the algorithm's attrs config class, if it has one.
        factory: the optimizer factory (checked by signature when no config).
        extra: further accepted keywords that are not hyperparameters.
        check_unknown: False checks only the values of the keywords the
            factory's signature does not reject (a saved param group carries
            keys no signature names); its defaults still declare arities.
        defaults: declared defaults over the factory signature's (a betas
            default declares how many betas there are).

    Returns:
        The config instance when ``config`` is given, else None.

    Raises:
        HyperparameterError: an unknown keyword (with a did-you-mean) or a
            value that breaks its constraint; the message names the algorithm.
    """
    given = {k: v for k, v in hparams.items() if k not in set(extra)}
    if config is not None:
        reject_unknown(given, {f.name for f in attrs.fields(config)}, algorithm)
        try:
            return config(**given)
        except HyperparameterError as error:
            raise error.for_algorithm(algorithm) from None
    if check_unknown and factory is not None and not _accepts_any_keyword(factory):
        reject_unknown(given, {p.name for p in _keyword_parameters(factory)}, algorithm)
    defaults = {**(_signature_defaults(factory) if factory is not None else {}), **(defaults or {})}
    for name, value in given.items():
        if name in _WELL_KNOWN:
            check, _ = _WELL_KNOWN[name]
            try:
                check(None, _FieldName(name, defaults.get(name)), value)
            except HyperparameterError as error:
                raise error.for_algorithm(algorithm) from None
    return None


def _signature_defaults(factory: Callable[..., Any]) -> dict[str, Any]:
    """The factory's keyword defaults (a betas default declares its arity).

    A factory that cannot be inspected (a lazy reference that fails to
    import) declares nothing; calling it reports why.
    """
    try:
        parameters = _keyword_parameters(factory)
    except Exception:
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


@attrs.frozen
class _FieldName:
    """Stand-in for ``attrs.Attribute`` when validating without a config class.

    ``default`` is the factory signature's default, if any.
    """

    name: str
    default: Any = None


for _public in (LazyConfig, lazy_config, lazy_config_lookup):
    _public.__module__ = __name__  # published here; defined beside LazyCallable
