"""Generate ``plugins/heavyball/src/optiplug_heavyball/catalog.py`` from the installed heavyball.

Run it after a heavyball upgrade, review the diff, then run
``tests/test_bridge_heavyball.py`` (which checks the table against the
installed classes)::

    python scripts/bridge_catalog_heavyball.py > plugins/heavyball/src/optiplug_heavyball/catalog.py
    ruff format plugins/heavyball/src/optiplug_heavyball/catalog.py

What it reads from heavyball:

* the optimizer classes: ``heavyball.__all__`` entries that subclass
  ``torch.optim.Optimizer``, less :data:`EXCLUDED` (wrappers, each with its
  reason);
* each class's signature: every keyword with its default (heavyball's
  ``use_default`` sentinel becomes :data:`LIBRARY_DEFAULT`: the class decides);
* the paper: the first ``https://`` address under "Sources:" in the class's
  docstring (heavyball's own records are skipped when a paper is cited);
* the state: each class is stepped twice, eagerly (``compile_mode = None``),
  on one 6x4 float32 parameter; every key of its per-parameter state becomes a
  slot, with its kind (tensor, list of tensors, anything), and keys that appear
  only with ``mars=True`` or ``precond_grad_accum=True`` get that condition.

What it does not read, and comes from the reviewed tables below instead: the
registered names (:data:`NAMES`), each keyword's valid range (:data:`RULES`,
from heavyball's own checks and docs), and the limitations found by the
tests (:data:`LIMITATIONS`).
"""

from __future__ import annotations

import inspect
import pprint
import re
import sys
import warnings
from typing import Any

import heavyball  # type: ignore[import-untyped]
import torch
from heavyball import chainable, utils

from optiplug_heavyball.state import flat_state_dict

NAMES = {
    "SGD": "sgd",
    "AdamW": "adamw",
    "NAdam": "nadam",
    "AdEMAMix": "ademamix",
    "UnscaledAdamW": "unscaled_adamw",
    "SUDSAdamW": "suds_adamw",
    "Scion": "scion",
    "AdamC": "adamc",
    "RMSprop": "rmsprop",
    "HyperBallAdamW": "hyperball_adamw",
    "MuonAdamW": "muon_adamw",
    "SFAdamW": "sf_adamw",
    "MSAMLaProp": "msam_laprop",
    "ADOPT": "adopt",
    "Muon": "muon",
    "LaProp": "laprop",
    "MuonLaProp": "muon_laprop",
    "SOAP": "soap",
    "KLSOAP": "kl_soap",
    "KLShampoo": "kl_shampoo",
    "SOAPNAdam": "soap_nadam",
    "SOAPAdEMAMix": "soap_ademamix",
    "SignLaProp": "sign_laprop",
    "SOLP": "solp",
    "HeavySOAP": "heavy_soap",
    "HeavyKLSOAP": "heavy_kl_soap",
    "HeavyKLShampoo": "heavy_kl_shampoo",
    "HeavySOAPNAdam": "heavy_soap_nadam",
    "HeavySOAPAdEMAMix": "heavy_soap_ademamix",
    "HeavySOLP": "heavy_solp",
    "OrthoLaProp": "ortho_laprop",
    "LaPropOrtho": "laprop_ortho",
    "PSGDKron": "psgd_kron",
    "LATHER": "lather",
    "PSGDPRO": "psgd_pro",
    "QSGD": "qsgd",
    "PSGDLRA": "psgd_lra",
}
"""Class -> registered name: heavyball's spelling, lower-cased snake_case."""

EXCLUDED = {
    "SOAPBase": "abstract base of the SOAP family (not in heavyball.__all__, no update rule)",
    "PSGDBase": "abstract base of the PSGD family (not in heavyball.__all__, no update rule)",
    "SplitOpt": "a container that delegates parameter groups to other heavyball optimizers "
    "(optiplug's own `multi` composes registered optimizers)",
    "SAMWrapper": "a wrapper around another heavyball optimizer instance that needs a closure "
    "on every step; its state dict nests the wrapped optimizer's",
}
"""Optimizer classes heavyball exports that are not registered, and why."""

RULES = {
    "lr": "lr",
    "betas": "betas",
    "alpha": "non_negative",
    "alpha_warmup": "optional_positive_int",
    "beta3_warmup": "optional_positive_int",
    "beta2_scale": "positive",
    "dampening": "non_negative",
    "ecc": "optional_str",
    "param_ecc": "optional_str",
    "eps": "positive",
    "init_factor": "positive",
    "lower_bound_beta": "beta",
    "shampoo_beta": "beta",
    "max_lr": "optional_positive",
    "mars_gamma": "non_negative",
    "max_precond_dim": "positive_int",
    "max_size_triangular": "positive_int",
    "precondition_frequency": "positive_int",
    "precond_update_power_iterations": "positive_int",
    "min_ndim_triangular": "non_negative_int",
    "memory_save_mode": "memory_save_mode",
    "momentum_decay": "non_negative",
    "orig_shapes": "any",
    "precond_init_scale": "optional_positive",
    "precond_init_scale_power": "optional_finite",
    "precond_init_scale_scale": "positive",
    "precond_lr": "non_negative",
    "precond_scheduler": "any",
    "q_dtype": "dtype_name",
    "storage_dtype": "dtype_name",
    "r": "non_negative",
    "rank": "optional_positive_int",
    "sam_step_size": "non_negative",
    "scale": "positive",
    "warmup_steps": "non_negative_int",
    "weight_decay": "non_negative",
    "weight_lr_power": "non_negative",
    "gradient_clipping": "any",
    "update_clipping": "any",
    "preconditioner_update_probability": "any",
    "hvp_interval": "positive_int",
}
"""Keyword -> validation rule (``optiplug_heavyball.config.RULES``); bools are found by default."""

LIMITATIONS: dict[str, str] = {}
"""Registered name -> why it cannot pass optiplug's checks on CPU (found by the tests)."""

KEEPS_NORM: frozenset[str] = frozenset({"hyperball_adamw", "ortho_laprop", "laprop_ortho"})
"""Registered names whose update keeps each matrix's norm (HyperBall) or cannot shrink it
(OrthoGrad removes the gradient's component along the parameter): tagged ``keeps-norm``, so
the convergence check gives them a target of the starting norm, one they can reach."""

EXAMPLE_HPARAMS: dict[str, dict[str, Any]] = {}
"""Registered name -> keywords the conformance checks add (e.g. a learning rate that converges)."""

LIBRARY_DEFAULT = "heavyball-default"
_SOURCES = re.compile(r"https://\S+")
_OWN = ("github.com/HomebrewML", "zenodo.org")
_SHAPE = (6, 4)


def optimizer_classes() -> dict[str, type]:
    """Every optimizer class heavyball exports (``__all__`` and the two bases), by name."""
    found = {}
    for name in dir(heavyball):
        value = getattr(heavyball, name)
        if isinstance(value, type) and issubclass(value, torch.optim.Optimizer):
            found[name] = value
    return found


def parameters(cls: type) -> list[tuple[str, Any, str]]:
    """``(name, default, rule)`` of every keyword of ``cls`` after ``params``."""
    out = []
    for p in inspect.signature(cls.__init__).parameters.values():  # type: ignore[misc]
        if p.name in ("self", "params") or p.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        default = LIBRARY_DEFAULT if p.default is chainable.use_default else p.default
        out.append((p.name, default, rule_of(p.name, default)))
    return out


def rule_of(name: str, default: Any) -> str:
    """The validation rule of one keyword."""
    if name == "beta":
        return "optional_beta" if default is None else "beta"
    if isinstance(default, bool) or (default == LIBRARY_DEFAULT and name not in RULES):
        return "bool"
    return RULES[name]


def paper_of(cls: type) -> str:
    """The first address the docstring cites under "Sources:" (a paper before heavyball's own)."""
    doc = cls.__doc__ or ""
    urls: list[str] = _SOURCES.findall(doc.split("Sources:", 1)[1]) if "Sources:" in doc else []
    cited = [u for u in urls if not any(own in u for own in _OWN)]
    return (cited or urls or [""])[0]


def summary_of(cls: type) -> str:
    """The docstring's description (its first sentence), else the title of the source it cites."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n") if p.strip()]
    if paragraphs and " " not in paragraphs[0]:  # a bare name ("SOAP", "KL-Shampoo")
        paragraphs = paragraphs[1:]
    described = [p for p in paragraphs if not p.startswith("Sources")]
    if described:
        return described[0].rstrip(":").split(". ")[0].rstrip(".")
    cited = doc.split("Sources:", 1)[1].splitlines() if "Sources:" in doc else []
    titles = [t.strip() for t in cited if t.strip() and not t.strip().endswith(":")]
    return titles[0] if titles else cls.__name__


Found = dict[str, tuple[str, str, str]]
_VECTOR = (5,)


def state_keys(cls: type, **hparams: Any) -> Found | None:
    """Flattened state keys -> ``(kind, shape, dtype)`` after two steps on a matrix and a vector.

    None when the two parameters keep different keys (a class that routes
    matrices and vectors to different updates): no slot list fits every
    parameter.
    """
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*_SHAPE)), torch.nn.Parameter(torch.randn(*_VECTOR))]
    opt = cls(params, **hparams)
    for _ in range(2):
        for param in params:
            param.grad = torch.randn(param.shape)
        opt.step()
    state = flat_state_dict(opt.state_dict())["state"]
    matrix = {k: describe(cls, v, _SHAPE) for k, v in state[0].items()}
    vector = {k: describe(cls, v, _VECTOR) for k, v in state[1].items()}
    if matrix.keys() != vector.keys():
        return None
    return {key: merged(matrix[key], vector[key]) for key in matrix}


def merged(a: tuple[str, str, str], b: tuple[str, str, str]) -> tuple[str, str, str]:
    """The description that fits both: equal parts kept, others ``"any"``."""
    if a[0] != b[0]:
        return ("any", "any", "any")
    return (a[0], a[1] if a[1] == b[1] else "any", a[2] if a[2] == b[2] else "any")


def describe(cls: type, value: Any, shape: tuple[int, ...]) -> tuple[str, str, str]:
    """``(kind, shape, dtype)`` of one state value of a parameter of ``shape``."""
    reshapes = any(k in inspect.signature(cls.__init__).parameters for k in ("merge_dims", "split"))  # type: ignore[misc]
    if isinstance(value, torch.Tensor):
        if value.ndim == 0:
            kept = "scalar"
        elif tuple(value.shape) == shape and not reshapes:
            kept = "param"
        else:
            kept = "any"
        return ("tensor", kept, "float" if value.is_floating_point() else "any")
    if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
        return ("any", "any", "any")
    if isinstance(value, (int, float)):
        return ("number", "scalar", "any")
    if value and all(isinstance(v, torch.Tensor) and v.is_floating_point() for v in value):
        return ("tensors", "any", "float")
    return ("any", "any", "any")


def slots(cls: type) -> list[tuple[str, str, str, str, str | None]] | None:
    """``(name, kind, shape, dtype, when)`` of every state slot; None if they depend on the shape."""
    base = state_keys(cls)
    if base is None:
        return None
    out: list[tuple[str, str, str, str, str | None]] = [
        (k, *v, None) for k, v in sorted(base.items())
    ]
    accepted = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
    for flag in ("mars", "precond_grad_accum"):
        if flag in accepted:
            extra = state_keys(cls, **{flag: True}) or {}
            out += [(k, *v, flag) for k, v in sorted(extra.items()) if k not in base]
    return out


def entry(name: str, cls: type) -> dict[str, Any]:
    """The catalogue row of one class."""
    return {
        "name": NAMES[name],
        "target": f"heavyball:{name}",
        "summary": summary_of(cls),
        "paper": paper_of(cls),
        "params": parameters(cls),
        "slots": slots(cls),
        "train_eval": callable(getattr(cls, "train", None)),
        "limitation": LIMITATIONS.get(NAMES[name], ""),
        "example_hparams": EXAMPLE_HPARAMS.get(NAMES[name], {}),
        "keeps_norm": NAMES[name] in KEEPS_NORM,
    }


def main() -> None:
    """Print the catalogue module."""
    warnings.filterwarnings("ignore")
    utils.compile_mode = None
    classes = optimizer_classes()
    missing = set(classes) - set(NAMES) - set(EXCLUDED)
    if missing:
        sys.exit(f"new heavyball optimizers, add them to NAMES or EXCLUDED: {sorted(missing)}")
    rows = [entry(name, cls) for name, cls in classes.items() if name in NAMES]
    rows.sort(key=lambda row: row["name"])
    print(HEADER.format(version=heavyball_version()))
    print(f"EXCLUDED: dict[str, str] = {pprint.pformat(EXCLUDED, width=100)}")
    print('"""heavyball optimizer classes not registered, and why."""\n')
    print(f"CATALOG: tuple[Entry, ...] = {render(rows)}")
    print('"""Every registered heavyball optimizer, sorted by name."""')


def heavyball_version() -> str:
    """The installed heavyball's version."""
    from importlib.metadata import version

    return str(version("heavyball"))


def render(rows: list[dict[str, Any]]) -> str:
    """The rows as ``Entry(...)`` source."""
    parts = []
    for row in rows:
        params = ", ".join(f"Param({n!r}, {d!r}, {r!r})" for n, d, r in row["params"])
        slot_text = (
            "None"
            if row["slots"] is None
            else "(" + "".join(f"Slot{tuple(s)!r}, " for s in row["slots"]) + ")"
        )
        parts.append(
            f"Entry(name={row['name']!r}, target={row['target']!r}, summary={row['summary']!r}, "
            f"paper={row['paper']!r}, params=({params},), slots={slot_text}, "
            f"train_eval={row['train_eval']!r}, limitation={row['limitation']!r}, "
            f"example_hparams={row['example_hparams']!r}, keeps_norm={row['keeps_norm']!r})"
        )
    return "(\n" + ",\n".join(parts) + ",\n)"


HEADER = '''"""The heavyball optimizers optiplug registers: a static table, torch-free.

Generated by ``scripts/bridge_catalog_heavyball.py`` from heavyball {version}
and reviewed; ``tests/test_bridge_heavyball.py`` checks it against the
installed classes (every class present, every keyword and default equal).
"""

from __future__ import annotations

from typing import Any, NamedTuple

LIBRARY = "heavyball"
VERSION = "{version}"
LIBRARY_DEFAULT = "{default}"
"""Stands for heavyball's ``use_default``: the keyword is not passed, the class decides."""


class Param(NamedTuple):
    """One keyword of a class: name, default, validation rule (``config.RULES``)."""

    name: str
    default: Any
    rule: str


class Slot(NamedTuple):
    """One per-parameter state key (of view 0; view ``i > 0`` is ``key@i``)."""

    name: str
    kind: str
    shape: str
    dtype: str
    when: str | None


class Entry(NamedTuple):
    """One registered optimizer."""

    name: str
    target: str
    summary: str
    paper: str
    params: tuple[Param, ...]
    slots: tuple[Slot, ...] | None
    """None: the keys depend on the parameter's shape (matrices and vectors
    take different updates); optiplug's generic state checks apply."""
    train_eval: bool
    limitation: str
    example_hparams: dict[str, Any]
    keeps_norm: bool = False
    """The update keeps (or cannot shrink) each matrix's norm: tagged ``keeps-norm``."""

'''.replace("{default}", LIBRARY_DEFAULT)

if __name__ == "__main__":
    main()
