"""How ``TrainingArguments`` reads for the names optiplug serves: ``optim_args``, target modules.

:func:`~optiplug_integrations.transformers.from_training_args` reads
``optim_args`` here as transformers reads it for each name it reads it for
(``adamw_anyprecision``, ``grokadamw``, the GaLore and APOLLO projection
keys), checks ``optim_target_modules``, and refuses what a layer-wise name
cannot serve. Importing it imports torch and transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import TrainingArguments
from transformers.training_args import ParallelMode

from optiplug.errors import HyperparameterError

__all__ = [
    "TARGET_GROUP_ARGS",
    "TARGET_KEYWORDS",
    "layerwise_caveat",
    "read_optim_args",
    "target_modules",
    "typed_optim_args",
]


_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")
"""What transformers' ``strtobool`` reads as True and as False."""

_ANYPRECISION_DEFAULTS = {
    "use_kahan_summation": "False",
    "momentum_dtype": "float32",
    "variance_dtype": "float32",
    "compensation_buffer_dtype": "bfloat16",
}
"""The ``optim_args`` transformers reads for ``adamw_anyprecision``, with its defaults."""

_BF16_MOMENTS = (
    "bfloat16 moments are optiplug's bf16 state precision: the step runs in float32 on the "
    "decoded moments and rounds them back stochastically, where AnyPrecisionAdamW computes in "
    "bfloat16 and rounds each operation to nearest"
)


def _parse_optim_args(text: str) -> dict[str, str]:
    """``"key=value,key=value"`` (spaces ignored, as transformers reads it) -> a dict.

    Raises:
        HyperparameterError: an item is not ``key=value``.
    """
    found: dict[str, str] = {}
    for item in text.replace(" ", "").split(","):
        key, sep, value = item.partition("=")
        if not sep or not key or "=" in value:
            raise HyperparameterError("optim_args", text, f"{item!r} is not key=value")
        found[key] = value
    return found


def _anyprecision_hparams(text: str) -> tuple[dict[str, Any], str]:
    """``adamw_anyprecision``'s ``optim_args`` -> (optiplug ``adamw`` hyperparameters, caveat).

    float32 moments without Kahan summation are AdamW exactly; bfloat16 moments
    map to ``state_precision="bf16"`` with a caveat.

    Raises:
        HyperparameterError: an unknown key, a bad value, Kahan summation or
            mixed moment dtypes (nothing optiplug has computes them).
    """
    given = _parse_optim_args(text) if text else {}
    unknown = sorted(set(given) - set(_ANYPRECISION_DEFAULTS))
    if unknown:
        known = ", ".join(_ANYPRECISION_DEFAULTS)
        raise HyperparameterError("optim_args", text, f"unknown key {unknown[0]!r} (read: {known})")
    read = {**_ANYPRECISION_DEFAULTS, **given}
    kahan = read["use_kahan_summation"].lower()
    if kahan not in _TRUE + _FALSE:
        raise HyperparameterError(
            "optim_args", text, f"use_kahan_summation={kahan!r} is not a bool"
        )
    for key in ("momentum_dtype", "variance_dtype", "compensation_buffer_dtype"):
        if not isinstance(getattr(torch, read[key], None), torch.dtype):
            raise HyperparameterError("optim_args", text, f"{key}={read[key]!r} is no torch dtype")
    if kahan in _TRUE:
        raise HyperparameterError(
            "optim_args", text, "use_kahan_summation=True: optiplug's adamw has no "
            "Kahan-compensated parameter update; use False"
        )  # fmt: skip
    moments = (read["momentum_dtype"], read["variance_dtype"])
    if moments == ("float32", "float32"):
        return {}, ""
    if moments == ("bfloat16", "bfloat16"):
        return {"state_precision": "bf16"}, _BF16_MOMENTS
    raise HyperparameterError(
        "optim_args", text, f"momentum_dtype={moments[0]}, variance_dtype={moments[1]}: optiplug "
        "keeps both moments in one precision; give both float32 or both bfloat16"
    )  # fmt: skip


_Typed = dict[str, tuple[Callable[[str], Any], Any]]
"""``key -> (conversion, default)`` of the ``optim_args`` transformers reads for a name."""

_GROKADAMW_ARGS: _Typed = {
    "alpha_init": (float, 0.98),
    "lamb": (float, 2.0),
    "gamma": (float, 0.1),
    "grokking_signal_decay_rate": (float, 0.1),
    "gradient_clipping": (float, 1.0),
}
_GALORE_ARGS: _Typed = {
    "rank": (int, 128),
    "update_proj_gap": (int, 200),
    "scale": (float, 0.25),
    "proj_type": (str, "std"),
}
_APOLLO_ARGS: _Typed = {
    "rank": (int, 128),
    "proj": (str, "random"),
    "scale_type": (str, "channel"),
    "update_proj_gap": (int, 200),
    "scale": (float, 1.0),
    "proj_type": (str, "std"),
}
TARGET_GROUP_ARGS: dict[str, _Typed] = {
    "galore_adamw": _GALORE_ARGS,
    "galore_adamw_8bit": _GALORE_ARGS,
    "galore_adafactor": _GALORE_ARGS,
    "apollo_adamw": _APOLLO_ARGS,
}
"""``optim`` -> the ``optim_args`` transformers puts in its target-module group, with defaults."""

TARGET_KEYWORDS: dict[str, dict[str, Any]] = {
    "galore_adafactor": {"scale_parameter": False, "relative_step": False},
}
"""Constructor keywords transformers fixes for a target-module name."""


def typed_optim_args(text: str, table: _Typed) -> dict[str, Any]:
    """``optim_args`` read as transformers reads them for a name: ``table``'s keys, converted.

    Every key of ``table`` is returned, its default where ``text`` omits it.

    Raises:
        HyperparameterError: an item is not ``key=value``, a key is unknown
            (transformers ignores it; here it is a typo until shown otherwise)
            or a value does not convert.
    """
    given = _parse_optim_args(text) if text else {}
    unknown = sorted(set(given) - set(table))
    if unknown:
        known = ", ".join(table)
        raise HyperparameterError("optim_args", text, f"unknown key {unknown[0]!r} (read: {known})")
    read = {key: default for key, (_, default) in table.items()}
    for key, value in given.items():
        convert = table[key][0]
        try:
            read[key] = convert(value)
        except ValueError:
            kind = convert.__name__
            raise HyperparameterError("optim_args", text, f"{key}={value!r} is no {kind}") from None
    return read


_OPTIM_ARGS: dict[str, Callable[[str], tuple[dict[str, Any], str]]] = {
    "adamw_anyprecision": _anyprecision_hparams,
    "grokadamw": lambda text: (typed_optim_args(text, _GROKADAMW_ARGS), ""),
}
"""``optim`` -> the reader of its ``TrainingArguments.optim_args`` (the names optiplug reads them for)."""


def read_optim_args(optim: str, text: str | None) -> tuple[dict[str, Any], str]:
    """``args.optim_args`` for ``optim`` -> (hyperparameters, caveat).

    Raises:
        HyperparameterError: ``optim_args`` given for a name optiplug does not
            read them for, or refused by the name's reader.
    """
    reader = _OPTIM_ARGS.get(optim)
    if reader is not None:
        return reader(text or "")
    if text:
        raise HyperparameterError(
            "optim_args",
            text,
            "TrainingArguments.optim_args is not read by optiplug for this optim: pass those "
            "hyperparameters as keywords to from_training_args()",
        )
    return {}, ""


def layerwise_caveat(args: TrainingArguments) -> str:
    """What a layer-wise run under ``args`` does differently (gradient clipping), or "".

    Raises:
        HyperparameterError: what transformers' layer-wise path refuses too
            (gradient accumulation, DDP), or what would step on gradients
            not yet final (fp16's gradient scaler, FSDP's flattened shards, DeepSpeed).
    """
    accumulation, mode = args.gradient_accumulation_steps, args.parallel_mode
    refused = (
        ("gradient_accumulation_steps", accumulation, accumulation != 1,
         "each backward steps every parameter; accumulation needs 1"),
        ("parallel_mode", mode.value, mode == ParallelMode.DISTRIBUTED,
         "DDP averages gradients after the hooks have stepped (transformers refuses it too)"),
        ("fp16", args.fp16, bool(args.fp16), "the gradient scaler unscales after the hooks step"),
        ("fsdp", args.fsdp, bool(args.fsdp), "FSDP steps flat shards, not the hooked parameters"),
        ("deepspeed", args.deepspeed, bool(args.deepspeed), "DeepSpeed steps its own optimizer"),
    )  # fmt: skip
    for field, value, bad, why in refused:
        if bad:
            raise HyperparameterError(field, value, f"not with a layer-wise optim: {why}")
    if args.max_grad_norm:
        return (
            f"max_grad_norm={args.max_grad_norm} does not apply: each parameter steps inside "
            "the backward pass, before the Trainer clips (as transformers' layer-wise path does)"
        )
    return ""


def target_modules(optim: str, value: Any) -> str | tuple[str, ...]:
    """``TrainingArguments.optim_target_modules``, checked as transformers checks it.

    Raises:
        HyperparameterError: it is None, or neither a string nor a list of strings.
    """
    if value is None:
        raise HyperparameterError(
            "optim_target_modules", None, f"is required for optim={optim!r}: the modules whose "
            "weights are projected (a list of names or regular expressions, a regular "
            "expression, or 'all-linear')",
        )  # fmt: skip
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return tuple(value)
    raise HyperparameterError(
        "optim_target_modules", value, "must be a list of strings, a regular expression or "
        "'all-linear'",
    )  # fmt: skip
