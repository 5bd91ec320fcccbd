"""Generate the static catalogue of optiplug-pytorch-optimizer from the installed library.

Run it after upgrading ``pytorch-optimizer``, review the diff and commit the
result::

    python scripts/bridge_catalog_pytorch_optimizer.py > \\
        plugins/pytorch_optimizer/src/optiplug_pytorch_optimizer/catalog.py
    ruff format plugins/pytorch_optimizer/src/optiplug_pytorch_optimizer/catalog.py

What it reads, per optimizer of ``pytorch_optimizer.optimizer.OPTIMIZERS``:

* the constructor's signature: every keyword, its default and its type;
* the library's own range checks (``self.validate_range(x, 'x', lo, hi)``,
  ``validate_non_negative``, ``validate_positive``, ``validate_betas``,
  ``validate_options``, ``validate_learning_rate``...) in ``__init__``;
* the paper each optimizer's row cites in the package's README (its
  distribution metadata);
* the state it really keeps: the class is stepped three times on a 4x4 and
  on a 4-element parameter, and once more with each boolean flipped (a slot
  that appears only then depends on that flag); the param-group keys it adds
  or changes while stepping are its running group state.

The reviewed facts (limitations, required example keywords, example dtypes)
are the tables ``REVIEWED_*`` below.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import inspect
import math
import re
import sys
import textwrap
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from pytorch_optimizer.optimizer import OPTIMIZERS

LIBRARY = "pytorch-optimizer"

REVIEWED_EXAMPLE_HPARAMS: dict[str, dict[str, Any]] = {
    "bsam": {"num_data": 16},
    # Ranger21 centralizes gradients by default, which removes the component of the
    # gradient the suite's target needs (as ROSE's centralize, below).
    "ranger21": {"num_iterations": 1000, "centralize_gradients": False},
    # The suite's lr=0.05 is far from these methods' scale (learning-rate-free
    # D-Adaptation multipliers, AdaDelta's unit lr...): the smallest of 0.1, 0.2,
    # 0.5, 1, 2, 5 that converges on the suite's quadratic.
    "adadelta": {"lr": 2.0},
    "adago": {"lr": 5.0},
    "adamod": {"lr": 1.0},
    "dadaptadagrad": {"lr": 1.0},
    "dadaptadan": {"lr": 0.2},
    "dadaptlion": {"lr": 0.2},
    "dadaptsgd": {"lr": 0.1},
    "gravity": {"lr": 0.2},
    "lars": {"lr": 0.5},
    "racs": {"lr": 0.2},
    "schedulefreeradam": {"lr": 0.1},
    "simplifiedademamix": {"lr": 1.0},
    "sophiah": {"lr": 1.0},
    # Nero's default constraints project each row onto zero mean and unit norm,
    # so it cannot reach an arbitrary target matrix.
    "nero": {"constraints": False},
    # ROSE centralizes gradients by default, which removes the component of the
    # gradient the suite's target needs.
    "rose": {"centralize": False},
    # SaRA trains only weights smaller than threshold; none of the suite's are at 1e-3.
    "sara": {"threshold": 10.0},
}
"""Keywords a working example needs (the conformance checks add them)."""

REVIEWED_EXAMPLE_DTYPE: dict[str, str] = {
    "fadam": "float32",
}
"""Optimizers whose kernels need another dtype than the suite's float64."""

REVIEWED_MUON_GROUPS = frozenset(
    {"adago", "adamuon", "distributedmuon", "muon", "muonclip", "normuon"}
)
"""The Muon family: every param group needs ``use_muon`` (the wrapper sets it by dimension)."""

REVIEWED_CONSTRAINTS: dict[tuple[str, str], tuple[Any, ...]] = {
    # The library accepts beta1 = 1 ("[]"), which freezes the momentum; optiplug's [0, 1).
    ("pnm", "betas"): ("betas", "[)", "[]"),
}
"""Where the bridge is stricter than the library's check, and why (in the comment)."""

_UNSTORABLE = "which optiplug checkpoints cannot store (tensors, numbers, strings and lists only)"

REVIEWED_CLOSURE = frozenset({"alig", "bsam", "lbfgs"})
"""Classes whose step needs a closure (AliG's step size, BSAM's perturbed loss, L-BFGS's line
search): the spec's ``step_closure``."""

REVIEWED_CREATE_GRAPH = frozenset({"adahessian", "sophiah"})
"""Classes that differentiate the gradients (Hutchinson's Hessian estimate): the spec's
``create_graph``."""

REVIEWED_OWN_RNG = frozenset({"adahessian", "kron", "sophiah", "spam"})
"""Classes whose step draws random numbers from the global generators (Hutchinson's probe
vectors, Kron's preconditioner updates and balancing, SPAM's mask resampling): the wrapper seeds
them from a stream of its own, whose seed and step count a checkpoint carries, so a resumed run
draws the same."""

_RNG_ATTRIBUTES = (("bridge_rng_seed", "value"), ("bridge_rng_step", "value"))

REVIEWED_ATTRIBUTES: dict[str, tuple[tuple[str, str], ...]] = {
    # Running state kept as attributes of the optimizer, outside optimizer.state
    # (the class's own state_dict() adds them as top-level keys, which optiplug
    # refuses): "value" for a plain number, "state_dict" for an object with
    # state_dict()/load_state_dict() (the SPAM family's CosineDecay warmup).
    "ranger21": (("lookahead_step", "value"), ("starting_lr", "value"), ("current_lr", "value")),
    "spam": (("warmup", "state_dict"),),
    "stablespam": (("total_step", "value"), ("warmup", "state_dict")),
}
"""Attributes the wrapper carries in the first param group as ``attr:<name>``."""

REVIEWED_PACKED: dict[str, tuple[str, ...]] = {
    "aggmo": ("momentum_buffer",),  # a dict {beta: buffer}
    "adashift": ("grad_queue",),  # a deque of the last keep_num gradients
    "dash": ("blocks",),  # a list of dicts of tensors and lists of tensors, one per block
    "conda": ("projector",),  # a GaLoreProjector (its orthogonal matrix and last SVD step)
    "scalableshampoo": ("pre_conditioner", "graft"),  # PreConditioner and Graft objects
}
"""Slots holding nested containers: kept as their tensors plus a ``<slot>:layout`` tuple."""

REVIEWED_TAKES_MODEL = frozenset({"adammini"})
"""Classes whose first argument is a model (AdamMini partitions by parameter name): the wrapper
passes a module holding the given parameters under their names; ``model`` is no keyword."""

REVIEWED_UNAVAILABLE: dict[str, tuple[tuple[str, str], ...]] = {
    # LoRA-RITE keeps its factor state for the matrices it updates as low-rank
    # adapter pairs (left and right factors, their bases and escape masses),
    # which a lone probe matrix never gets: every slot optional, shapes its own.
    "lorarite": (
        ("step", "any", "any", "any", False, None, True),
        ("v_l", "tensor", "any", "param", True, None, True),
        ("v_r", "tensor", "any", "param", True, None, True),
        ("m_l", "tensor", "any", "param", True, None, True),
        ("m_r", "tensor", "any", "param", True, None, True),
        ("basis_l", "tensor", "any", "param", True, None, True),
        ("basis_r", "tensor", "any", "param", True, None, True),
        ("escape_l", "tensor", "any", "param", True, None, True),
        ("escape_r", "tensor", "any", "param", True, None, True),
    ),
    "flashadamw": (
        (
            "fused",
            "FlashAdamW's fused Triton kernels are not in pytorch-optimizer's portable backend "
            "(fused=True raises NotImplementedError)",
        ),
    ),
}
"""Implementations a class's signature offers that never run, and why."""

REVIEWED_SLOTS: dict[str, tuple[tuple[Any, ...], ...]] = {
    # AliG keeps a momentum buffer when momentum (a float, 0 by default) is above 0;
    # probing flips booleans only.
    "alig": (("momentum_buffer", "tensor", "param", "param", True, "momentum"),),
    # AdamMini's state depends on each parameter's name: embedding and output
    # blocks keep v, query/key projections a per-head v_mean and head count,
    # the rest one v_mean with dimension and reduced. Only m is always there.
    "adammini": (
        ("m", "tensor", "any", "float32", True, None, False),
        ("v", "tensor", "param", "float32", True, None, True),
        ("v_mean", "tensor", "any", "float32", True, None, True),
        ("head", "any", "any", "any", False, None, True),
        ("dimension", "tensor", "scalar", "float32", True, None, True),
        ("reduced", "any", "any", "any", False, None, True),
    ),
    # FlashAdamW keeps each moment either quantized (int8/uint8 values plus fp16
    # scales, when quantize is on) or plain (quantize off, or a state dict saved
    # with compress_state_dict=False, which dequantizes); low-precision parameters
    # with master_weight_bits add integer error bits. Probing cannot declare a slot
    # that exists when a flag is off, so: the quantized ones only with quantize,
    # and every one optional.
    "flashadamw": (
        ("exp_avg::quantized", "tensor", "param", "any", True, "quantize", True),
        ("exp_avg::scales", "tensor", "any", "any", True, "quantize", True),
        ("exp_avg_sq::quantized", "tensor", "param", "any", True, "quantize", True),
        ("exp_avg_sq::scales", "tensor", "any", "any", True, "quantize", True),
        ("exp_avg", "tensor", "param", "any", True, None, True),
        ("exp_avg_sq", "tensor", "param", "any", True, None, True),
        ("error_bits", "tensor", "param", "any", False, None, True),
    ),
}
"""Slot layouts reviewed by hand where probing cannot find them (with why, in the comment)."""

REVIEWED_LIMITATIONS: dict[str, str] = {
    "distributedmuon": "needs an initialised torch.distributed process group",
    "magma": "wraps another optimizer instance (its first argument); it is not built from parameters",
    "bsam": "its step(closure) needs gradients already computed when it is called (its first "
    "perturbation creates the state from them; without them it raises KeyError 's' upstream), "
    "which a closure step does not give; given them, the suite's quadratic grows about "
    "50-fold in 200 steps for every lr from 0.001 to 0.5 and num_data from 16 to 100000",
    "lomo": "takes the model, not parameters, and updates inside its own fused backward",
    "adalomo": "takes the model, not parameters, and updates inside its own fused backward",
    "spectralsphere": "updates matrices only: a parameter of another rank (a bias) raises "
    "ValueError 'SpectralSphere only supports 2D parameters' upstream at its first step; give "
    "it the 2-D parameters and another optimizer the rest (optiplug's multi)",
    "demo": "all-gathers its compressed momentum over torch.distributed every step, so it needs "
    "an initialised process group (and the optional package einops)",
}
"""Optimizers that cannot pass optiplug's CPU checks, and why (shown by list/show)."""

_SLOW = "stays above 10% of the starting loss after 200 steps for every lr in [0.001, 1]"

REVIEWED_DEVIATIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "sara": (
        (
            "check_no_grad_step_is_noop",
            "SaRA creates its masks when it is constructed, before any gradient",
        ),
    ),
    "spam": (
        (
            "check_no_grad_step_is_noop",
            "SPAM creates the update masks of matrix parameters when it is constructed, "
            "before any gradient",
        ),
    ),
    "kate": (("check_quadratic_converges", _SLOW),),
    "shampoo": (("check_quadratic_converges", _SLOW),),
    "splus": (
        (
            "check_quadratic_converges",
            "SPlus's eval() swaps in its EMA weights, which it creates only at its first step: "
            "switching to eval before any step raises KeyError 'ema' upstream",
        ),
    ),
    "ranger": (("check_quadratic_converges", _SLOW),),
    "lorarite": (
        (
            "check_quadratic_converges",
            "LoRA-RITE updates low-rank adapter factor pairs; a single matrix does not move",
        ),
    ),
}
"""Single conformance checks an otherwise passing optimizer cannot meet, and why."""


# ------------------------------------------------------------------ papers
def papers() -> dict[str, str]:
    """``{normalised README name: paper URL}`` from the distribution's README table."""
    text = importlib.metadata.metadata(LIBRARY).get_payload()  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for line in str(text).splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 5 or not cells[1] or cells[1].startswith("-"):
            continue
        match = re.search(r"\[paper\]\((https?://[^)\s]+)\)", line)
        if match:
            found.setdefault(_norm(cells[1]), match.group(1))
    return found


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


_PAPER_ALIASES = {
    "dadaptadagrad": "dadaptation",
    "dadaptadam": "dadaptation",
    "dadaptadan": "dadaptation",
    "dadaptlion": "dadaptation",
    "dadaptsgd": "dadaptation",
    "schedulefreeadamw": "schedulefree",
    "schedulefreesgd": "schedulefree",
    "schedulefreeradam": "schedulefree",
    "scalableshampoo": "scalableshampoo",
    "kron": "psgd",
}


def paper_of(name: str, cls: Any, table: dict[str, str]) -> str:
    """The paper the README cites for ``name`` (by name, class name or alias), else ""."""
    for key in (name, _norm(cls.__name__), _PAPER_ALIASES.get(name, "")):
        if key and key in table:
            return table[key]
    return ""


# ------------------------------------------------------------------ ranges
def library_checks(cls: Any) -> dict[Any, tuple[Any, ...]]:
    """``{keyword: constraint}`` from the ``self.validate_*`` calls in ``cls.__init__``."""
    try:
        source = textwrap.dedent(inspect.getsource(cls.__init__))
    except (OSError, TypeError):
        return {}
    checks: dict[Any, tuple[Any, ...]] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        if not method.startswith("validate_") or not node.args:
            continue
        target = _target(node.args[0])
        if target is None:
            continue
        constraint = _constraint(method, node)
        if constraint is not None:
            name, index = target
            if index is None:
                checks[name] = constraint
            else:
                checks.setdefault(f"{name}[{index}]", constraint)
    return checks


def _target(node: ast.expr) -> tuple[str, int | None] | None:
    if isinstance(node, ast.Name):
        return node.id, None
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        return node.value.id, node.slice.value
    return None


def _literal(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def _keyword(node: ast.Call, name: str, position: int, default: Any) -> Any:
    for keyword in node.keywords:
        if keyword.arg == name:
            return _literal(keyword.value)
    return _literal(node.args[position]) if len(node.args) > position else default


def _constraint(method: str, node: ast.Call) -> tuple[Any, ...] | None:
    simple = {
        "validate_learning_rate": ("lr",),
        "validate_non_negative": ("non_negative",),
        "validate_positive": ("positive",),
        "validate_non_positive": ("non_positive",),
        "validate_step": ("step",),
    }
    if method in simple:
        return simple[method]
    if method == "validate_range":
        low, high = _keyword(node, "low", 2, None), _keyword(node, "high", 3, None)
        kind = _keyword(node, "range_type", 4, "[)")
        if isinstance(low, (int, float)) and isinstance(high, (int, float)):
            return ("range", float(low), float(high), kind)
    if method == "validate_betas":
        return (
            "betas",
            _keyword(node, "beta_range_type", 1, "[)"),
            _keyword(node, "beta3_range_type", 2, "[]"),
        )
    if method == "validate_options":
        options = _keyword(node, "options", 2, None)
        if isinstance(options, (list, tuple)):
            return ("options", tuple(options))
    return None


# ------------------------------------------------------------------ parameters
_SKIPPED = {"self", "params", "foreach", "fused"}


def parameters(cls: Any) -> list[tuple[str, Any, str, tuple[Any, ...], str]]:
    """``(name, default, type, constraint, source)`` for each keyword of ``cls.__init__``.

    ``source`` is ``"library"`` where the class checks the keyword itself (the
    constraint may be stricter, see :func:`_well_known`), ``"optiplug"`` where
    only optiplug's well-known rule does.
    """
    checks = library_checks(cls)
    for (owner, key), constraint in REVIEWED_CONSTRAINTS.items():
        if owner == cls.__name__.lower() or OPTIMIZERS.get(owner) is cls:
            checks[("", key)] = constraint
    found = []
    skipped = _SKIPPED | ({"model"} if _name_of(cls) in REVIEWED_TAKES_MODEL else set())
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name in skipped or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        default = p.default
        kind = _kind(p.name, default, str(p.annotation))
        constraint = _well_known(p.name, default, kind, checks)
        own = p.name in checks or any(f"{p.name}[{i}]" in checks for i in range(3))
        source = "library" if own or not constraint else "optiplug"
        found.append((p.name, default, kind, constraint, source))
    return found


def _kind(name: str, default: Any, annotation: str) -> str:
    if default is inspect.Parameter.empty:
        return "required"
    if type(default) is bool:
        return "bool"
    if isinstance(default, tuple) and name.endswith("betas"):
        return "betas"
    if type(default) is int:
        return "float" if "float" in annotation else "int"
    if type(default) is float:
        return "float"
    if type(default) is str:  # "str", or any value where the annotation allows others too
        others = ("tuple", "list", "float", "Callable")
        return "any" if any(other in annotation for other in others) else "str"
    if default is None:
        for text, kind in (("float", "float?"), ("int", "int?"), ("str", "str?")):
            if text in annotation and "Callable" not in annotation:
                return kind
    return "any"


def _betas(default: Any, checks: dict[Any, tuple[Any, ...]], name: str) -> tuple[Any, ...]:
    """Per beta: its range type, from ``validate_betas`` or per-element checks, else [0, 1)."""
    check = checks.get(name)
    kinds = []
    for index, value in enumerate(default):
        element = checks.get(f"{name}[{index}]")
        if element is not None and element[0] == "range":
            kinds.append(element[3])
        elif check is not None and check[0] == "betas":
            kinds.append(check[1] if index < 2 else check[2])
        else:
            kinds.append("[)" if value is None or value < 1 else "[]")
    return ("betas", *kinds)


def _well_known(
    name: str, default: Any, kind: str, checks: dict[Any, tuple[Any, ...]]
) -> tuple[Any, ...]:
    """The library's check for ``name``; optiplug's well-known rule where it is stricter."""
    if ("", name) in checks:
        return checks[("", name)]
    if kind == "betas":
        return _betas(default, checks, name)
    check = checks.get(name, ())
    number = isinstance(default, (int, float)) and not isinstance(default, bool)
    if name == "lr" or name.endswith("_lr"):
        return ("lr",)  # optiplug: finite and >= 0 (the library accepts inf and NaN)
    if name == "eps" and number and default > 0:
        return ("positive",)  # optiplug: eps = 0 divides by zero on a zero second moment
    if name == "weight_decay" and not check:
        return ("non_negative",)
    if name == "momentum" and not check and number and 0 <= default < 1:
        return ("range", 0.0, 1.0, "[)")
    return check


# ------------------------------------------------------------------ probing
def _quadratic(params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, steps: int) -> None:
    """``steps`` steps on ``||p - target||^2``, with a closure or a kept graph where reviewed."""
    name = _name_of(type(opt))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = sum(
            ((p - torch.linspace(-1, 1, p.numel(), dtype=p.dtype).view_as(p)) ** 2).sum()
            for p in params
        )
        assert isinstance(loss, torch.Tensor)
        loss.backward(create_graph=name in REVIEWED_CREATE_GRAPH)  # type: ignore[no-untyped-call]
        return loss

    for _ in range(steps):
        if name in REVIEWED_CLOSURE:
            opt.step(torch.enable_grad()(closure))  # as the wrapper runs it
        else:
            closure()
            opt.step()


def _params_for(cls: Any, param: torch.nn.Parameter) -> list[Any]:
    """``[param]``, in a group with ``use_muon`` for the Muon family, as a module for AdamMini."""
    if cls.__name__.lower() in REVIEWED_MUON_GROUPS:
        return [{"params": [param], "use_muon": param.ndim >= 2, "use_adamw": param.ndim < 2}]
    if _name_of(cls) in REVIEWED_TAKES_MODEL:
        from optiplug_pytorch_optimizer.optimizers import module_of

        return module_of([("layer.weight", param)])  # type: ignore[return-value]
    return [param]


def probe(
    cls: Any, hparams: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], torch.nn.Parameter]:
    """Step ``cls`` three times; ``(state entry, group after, group before, param)``."""
    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(*shape, generator=generator, dtype=dtype))
    optimizer = cls(_params_for(cls, param), **hparams)
    before = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    before = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in before.items()}
    if hasattr(optimizer, "train"):
        optimizer.train()
    _quadratic([param], optimizer, 3)
    if hasattr(optimizer, "eval"):
        optimizer.eval()
    after = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return packed(_name_of(cls), dict(optimizer.state[param])), after, before, param


def _name_of(cls: Any) -> str:
    return next(name for name, known in OPTIMIZERS.items() if known is cls)


def packed(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with its ``REVIEWED_PACKED`` slots in the form the wrapper keeps them."""
    from optiplug_pytorch_optimizer.optimizers import pack_value

    for slot in REVIEWED_PACKED.get(name, ()):
        if slot in entry:
            entry[slot], entry[f"{slot}:layout"] = pack_value(entry[slot])
    return entry


def describe_slot(value: Any, param: torch.Tensor) -> tuple[str, str, str, bool]:
    """``(kind, shape, dtype, finite)`` of one state value."""
    if torch.is_tensor(value):
        shape = "param" if value.shape == param.shape else "scalar" if value.ndim == 0 else "any"
        dtype = (
            "param"
            if value.dtype == param.dtype
            else ("float32" if value.dtype == torch.float32 else "any")
        )
        finite = bool(value.is_floating_point() and torch.isfinite(value).all())
        return "tensor", shape, dtype, finite
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # a Python number here may be a 0-d tensor for other shapes (Adafactor's RMS)
        return "any", "any", "any", False
    if isinstance(value, (list, tuple)) and value and all(torch.is_tensor(v) for v in value):
        finite = all(v.is_floating_point() and bool(torch.isfinite(v).all()) for v in value)
        dtypes = {v.dtype for v in value}
        dtype = "param" if dtypes == {param.dtype} else "any"
        return "tensors", "any", dtype, finite
    return "any", "any", "any", False


def _merge(
    a: tuple[str, str, str, bool], b: tuple[str, str, str, bool]
) -> tuple[str, str, str, bool]:
    if a[0] != b[0]:
        return ("any", "any", "any", False)
    return (a[0], a[1] if a[1] == b[1] else "any", a[2] if a[2] == b[2] else "any", a[3] and b[3])


def state_layout(
    name: str,
    cls: Any,
    hparams: dict[str, Any],
    dtype: torch.dtype,
    bools: list[str],
    defaults: dict[str, Any],
) -> tuple[tuple[Any, ...] | None, tuple[str, ...], str]:
    """``(slots or None, group_state, note)`` from probing the class."""
    matrix, after, before, param = probe(cls, hparams, (4, 4), dtype)
    try:
        vector, _, _, vparam = probe(cls, hparams, (4,), dtype)
    except ValueError:  # a matrix-only class (SpectralSphere)
        vector, vparam = matrix, param
    group_state = tuple(
        sorted(
            k
            for k, v in after.items()
            if k not in defaults and (k not in before or not _same(before[k], v))
        )
        + sorted(
            k for k in after if k in defaults and k in before and not _same(before[k], after[k])
        )
    )
    if name in REVIEWED_MUON_GROUPS:  # matrices on Muon (use_muon), the rest on AdamW (use_adamw)
        muon = [(k, *describe_slot(v, param), "use_muon") for k, v in matrix.items()]
        adamw = [(k, *describe_slot(v, vparam), "use_adamw") for k, v in vector.items()]
        return tuple(muon + adamw), group_state, ""
    slots: dict[str, tuple[Any, ...]] = {}
    for key in {**matrix, **vector}:
        if not isinstance(key, str):
            return None, group_state, "its state has non-string keys"
        if key in matrix and key in vector:
            merged = _merge(describe_slot(matrix[key], param), describe_slot(vector[key], vparam))
            slots[key] = (*merged, None)
        else:  # kept for matrices only, or vectors only (a factored second moment)
            seen, where = (matrix[key], param) if key in matrix else (vector[key], vparam)
            kind, _, dtype, finite = describe_slot(seen, where)
            if kind != "tensor":  # a number for one shape may be a 0-d tensor for another
                kind, dtype, finite = "any", "any", False
            slots[key] = (kind, "any", dtype, finite, None, True)
    for flag in bools:
        flipped = {**hparams, flag: not defaults[flag]}
        try:
            other, _, _, _ = probe(cls, flipped, (4, 4), dtype)
        except Exception:
            continue
        if set(other) < set(matrix) or (set(other) - set(matrix) and defaults[flag]):
            return None, group_state, f"its state layout depends on {flag}"
        for key in set(other) - set(matrix):
            slots[key] = (*describe_slot(other[key], param), flag)
    return tuple((k, *v) for k, v in slots.items()), group_state, ""


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    try:
        return bool(a == b)
    except Exception:
        return False


# ------------------------------------------------------------------ output
def literal(value: Any) -> str:
    """Python source for a default; ``LibraryDefault("...")`` for what has none."""
    if value is None or type(value) in (bool, str, int):
        return repr(value)
    if type(value) is float:
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    if isinstance(value, tuple):
        inner = ", ".join(literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    text = getattr(value, "__qualname__", None) or repr(value)
    if isinstance(value, torch.dtype):
        text = str(value)
    return f"LibraryDefault({text!r})"


def entries() -> Iterator[str]:
    table = papers()
    for name, cls in sorted(OPTIMIZERS.items()):
        params = parameters(cls)
        hparams = REVIEWED_EXAMPLE_HPARAMS.get(name, {})
        dtype = getattr(torch, REVIEWED_EXAMPLE_DTYPE.get(name, "float64"))
        defaults = {p[0]: p[1] for p in params}
        bools = [p[0] for p in params if p[2] == "bool" and p[0] not in ("maximize",)]
        limitation = REVIEWED_LIMITATIONS.get(name, "")
        slots: tuple[Any, ...] | None = None
        group_state: tuple[str, ...] = ()
        note = ""
        tensors: tuple[Any, ...] = ()
        globals_: tuple[Any, ...] = ()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                slots, group_state, note = state_layout(name, cls, hparams, dtype, bools, defaults)
                if name in REVIEWED_SLOTS:
                    slots, note = REVIEWED_SLOTS[name], ""
                tensors = group_tensors(cls, hparams, dtype)
                if not limitation:
                    globals_ = global_state(cls, hparams, dtype)
                    group_state = (*group_state, *(f"global:{g[0]}" for g in globals_))
                group_state += tuple(f"attr:{a}" for a, _ in attributes_of(name))
        except Exception as error:  # reviewed into REVIEWED_LIMITATIONS
            limitation = limitation or f"UNREVIEWED: {type(error).__name__}: {error}"[:200]
        yield _entry(
            name,
            cls,
            params,
            table,
            slots,
            group_state,
            note,
            limitation,
            hparams,
            tensors,
            globals_,
        )


def attributes_of(name: str) -> tuple[tuple[str, str], ...]:
    """The attributes the wrapper carries for ``name``: reviewed ones, its own stream's."""
    own = _RNG_ATTRIBUTES if name in REVIEWED_OWN_RNG else ()
    return REVIEWED_ATTRIBUTES.get(name, ()) + own


def group_tensors(cls: Any, hparams: dict[str, Any], dtype: torch.dtype) -> tuple[Any, ...]:
    """``(key, shape)`` of the param-group values the class keeps as non-scalar tensors."""
    _, after, _, _ = probe(cls, hparams, (4, 4), dtype)
    return tuple(
        (k, tuple(v.shape)) for k, v in sorted(after.items()) if torch.is_tensor(v) and v.ndim > 0
    )


def global_state(cls: Any, hparams: dict[str, Any], dtype: torch.dtype) -> tuple[Any, ...]:
    """``(key, kind, shape)`` of what the class keeps in ``optimizer.state`` under non-parameter keys.

    Only what the wrapper can carry in a param group: a 1-element tensor
    (``"tensor"``), a dict of numbers (``"dict"``) or a number
    (``"number"``); anything else raises.
    """
    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(4, 4, generator=generator, dtype=dtype))
    optimizer = cls(_params_for(cls, param), **hparams)
    _quadratic([param], optimizer, 3)
    found = []
    for key, value in optimizer.state.items():
        if torch.is_tensor(key):
            continue
        if torch.is_tensor(value) and value.numel() == 1:
            found.append((key, "tensor", tuple(value.shape)))
        elif type(value) in (int, float):
            found.append((key, "number", ()))
        elif isinstance(value, dict) and all(type(v) in (int, float) for v in value.values()):
            found.append((key, "dict", ()))
        else:
            raise TypeError(f"global state {key!r} is a {type(value).__name__}")
    return tuple(found)


def _entry(
    name: str,
    cls: Any,
    params: list[tuple[str, Any, str, tuple[Any, ...], str]],
    table: dict[str, str],
    slots: tuple[Any, ...] | None,
    group_state: tuple[str, ...],
    note: str,
    limitation: str,
    hparams: dict[str, Any],
    tensors: tuple[Any, ...],
    globals_: tuple[Any, ...] = (),
) -> str:
    lines = [
        "    Entry(",
        f"        name={name!r},",
        f"        target={cls.__module__ + ':' + cls.__qualname__!r},",
    ]
    lines.append("        params=(")
    for pname, default, kind, constraint, source in params:
        shown = "REQUIRED" if default is inspect.Parameter.empty else literal(default)
        extra = ', "optiplug"' if source == "optiplug" else ""
        lines.append(f"            Param({pname!r}, {shown}, {kind!r}, {constraint!r}{extra}),")
    lines.append("        ),")
    lines.append(f"        paper={paper_of(name, cls, table)!r},")
    summary = (inspect.getdoc(cls) or "").strip().splitlines()
    lines.append(f"        summary={(summary[0] if summary else cls.__name__)!r},")
    named = {p for p in inspect.signature(cls.__init__).parameters}
    flags = tuple(f for f in ("foreach", "fused") if f in named)
    if flags:
        lines.append(f"        flags={flags!r},")
    if slots is None:
        lines.append("        slots=None,")
    else:
        lines.append("        slots=(")
        for slot in slots:
            lines.append(f"            Slot{slot!r},")
        lines.append("        ),")
    if note:
        lines.append(f"        slots_note={note!r},")
    if group_state:
        lines.append(f"        group_state={tuple(group_state)!r},")
    if tensors:
        lines.append(f"        group_tensors={tensors!r},")
    if globals_:
        lines.append(f"        global_state={globals_!r},")
    if attributes_of(name):
        lines.append(f"        attributes={attributes_of(name)!r},")
    if name in REVIEWED_PACKED:
        lines.append(f"        packed={REVIEWED_PACKED[name]!r},")
    if name in REVIEWED_MUON_GROUPS:
        lines.append("        muon_groups=True,")
    if name in REVIEWED_CLOSURE:
        lines.append("        closure=True,")
    if name in REVIEWED_CREATE_GRAPH:
        lines.append("        create_graph=True,")
    if name in REVIEWED_OWN_RNG:
        lines.append("        own_rng=True,")
    if name in REVIEWED_TAKES_MODEL:
        lines.append("        takes_model=True,")
    if name in REVIEWED_UNAVAILABLE:
        lines.append(f"        unavailable={REVIEWED_UNAVAILABLE[name]!r},")
    if limitation:
        lines.append(f"        limitation={limitation!r},")
    if name in REVIEWED_DEVIATIONS:
        lines.append(f"        deviations={REVIEWED_DEVIATIONS[name]!r},")
    if hparams:
        lines.append(f"        example_hparams={hparams!r},")
    if name in REVIEWED_EXAMPLE_DTYPE:
        lines.append(f"        example_dtype={REVIEWED_EXAMPLE_DTYPE[name]!r},")
    if callable(getattr(cls, "train", None)) and callable(getattr(cls, "eval", None)):
        lines.append("        train_eval=True,")
    lines.append("    ),")
    return "\n".join(lines)


HEADER = '''"""The bridged optimizers of pytorch-optimizer {version}: a static table (no torch import).

Generated by ``scripts/bridge_catalog_pytorch_optimizer.py`` from the installed
library (signatures, defaults, the library's own range checks, the papers its
README cites, the state it keeps when stepped) and reviewed. A test checks it
against the installed classes, so a library upgrade that changes them fails.
"""

from __future__ import annotations

from .table import REQUIRED, Entry, LibraryDefault, Param, Slot

LIBRARY = "pytorch-optimizer"
VERSION = "{version}"

ENTRIES: tuple[Entry, ...] = (
'''


def docs_table() -> str:
    """The docs page's table: every catalogue entry with its class, paper and status."""
    from optiplug_pytorch_optimizer.catalog import ENTRIES  # the reviewed, committed table

    rows = ["| name | class | paper | status |", "|---|---|---|---|"]
    for entry in ENTRIES:
        paper = f"[paper]({entry.paper})" if entry.paper else ""
        status = f"limited: {entry.limitation}" if entry.limitation else "passes"
        if entry.deviations and not entry.limitation:
            status += " except " + "; ".join(
                f"`{check}` ({why})" for check, why in entry.deviations
            )
        rows.append(f"| `{entry.name}` | `{entry.target}` | {paper} | {status} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    if sys.argv[1:] == ["--docs"]:
        sys.stdout.write(docs_table())
        return 0
    version = importlib.metadata.version(LIBRARY)
    sys.stdout.write(HEADER.format(version=version))
    for entry in entries():
        sys.stdout.write(entry + "\n")
    sys.stdout.write(")\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
