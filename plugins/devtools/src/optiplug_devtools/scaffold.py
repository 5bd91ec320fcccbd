"""``optiplug new-plugin NAME [DIR]``: write a complete third-party plugin distribution.

The scaffold is a working plugin, ready to install, test and edit: a
torch-free entry-point module (config class, state layout, records), an
optimizer on :class:`optiplug.base.KernelTableOptimizer` (SGD with momentum,
with a ``loop`` and a ``foreach`` kernel sharing the state slot
``momentum_buffer``), tests running :mod:`optiplug.testing`'s conformance
checks plus the update formula, and a ``pyproject.toml`` naming the entry
point. The templates are strings in this module (no package data).

Nothing is written on error: the files go into a temporary sibling of
``DIR``, which is renamed into place only when every file is written.
Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import keyword
import os
import re
import secrets
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from string import Template

import optiplug
from optiplug import PLUGIN_API_VERSION, Registry
from optiplug.errors import OptiplugError

__all__ = [
    "MAX_NAME_LENGTH",
    "check_name",
    "check_target",
    "class_name",
    "configure",
    "core_requirement",
    "render",
    "run",
    "write_tree",
]

_NAME = re.compile(r"[a-z](?:[a-z0-9_]*[a-z0-9])?")
"""Lower case letters, digits and underscores; a letter first, no underscore last."""

MAX_NAME_LENGTH = 40
"""Longer names would make the generated code's layout depend on them (ruff format)."""

_TAKEN_CLASS_NAMES = frozenset(
    {
        "Any",
        "ClassVar",
        "Kernel",
        "KernelTableOptimizer",
        "Mapping",
        "Sequence",
        "Supports",
        "Tensor",
    }
)
"""Names the generated modules import: a class named like one gets an ``Optimizer`` suffix."""


# ------------------------------------------------------------------ the command
def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``new-plugin``'s arguments to ``parser``."""
    parser.add_argument(
        "name",
        help="the plugin's and its optimizer's name: a lower-case Python identifier (my_sgd)",
    )
    parser.add_argument(
        "dir",
        nargs="?",
        default=None,
        help="where to write it: a new or empty directory (default: ./optiplug-NAME)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the plugin ``args.name`` into ``args.dir`` and print what to do next.

    Args:
        args: the parsed arguments (``name``, ``dir``, ``registry``).

    Returns:
        0.

    Raises:
        OptiplugError: a bad or taken name, a ``DIR`` that exists and is not
            an empty directory, or a write that failed (nothing is left behind).
    """
    check_name(args.name, args.registry)
    shown = args.dir if args.dir is not None else f"optiplug-{args.name}"
    target = Path(shown)
    check_target(target)
    requirement = core_requirement(optiplug.__version__)
    files = render(args.name, requirement=requirement)
    write_tree(files, target)
    print(
        f"wrote {shown}: plugin {args.name!r}, distribution optiplug-{args.name} 0.1.0 "
        f"(requires {requirement})"
    )
    print("\n".join(f"  {path}" for path in sorted(files)))
    quoted = shlex.quote(shown)
    print("\nnext steps:")
    print(f"  pip install -e {quoted}")
    print(f"  optiplug list                  # {args.name} appears, status active")
    print(f"  pytest {shlex.quote(str(target / 'tests'))}")
    return 0


# ------------------------------------------------------------------ checks
def folded_name(name: str) -> str:
    """``name`` as optiplug's lookups compare names: lower case, letters and digits only."""
    return "".join(char for char in name.lower() if char.isalnum())


def check_name(name: str, registry: Registry) -> None:
    """Refuse a name that is malformed or already used in ``registry``.

    Names are compared as lookups compare them (``"adam_w"`` is taken when
    ``adamw`` exists): with optimizer names and aliases, plugin names, and
    the distribution ``optiplug-NAME`` with installed plugins' distributions.

    Args:
        name: the requested plugin and optimizer name.
        registry: the registry whose plugins are discovered and checked.

    Raises:
        OptiplugError: naming the rule broken, or the plugin (and
            distribution) that already provides the name.
    """
    if not _NAME.fullmatch(name):
        raise OptiplugError(
            f"plugin name {name!r} is not a lower-case Python identifier: use lower-case "
            "letters, digits and underscores, starting with a letter and not ending in '_'"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise OptiplugError(
            f"plugin name {name!r} is {len(name)} characters long; use at most {MAX_NAME_LENGTH}"
        )
    if keyword.iskeyword(name):
        raise OptiplugError(f"plugin name {name!r} is a Python keyword; choose another name")
    folded = folded_name(name)
    for spec in registry.optimizer_specs():
        origin = f" from {spec.provider}" if spec.provider is not None else ""
        for known in (spec.name, *spec.aliases):
            if folded_name(known) == folded:
                what = "an optimizer" if known == spec.name else f"an alias of {spec.name!r}"
                raise OptiplugError(
                    f"{name!r} is taken: {known!r} is {what}{origin}; choose another name"
                )
    dist = folded_name(f"optiplug-{name}")
    for info in registry.plugins():
        if folded_name(info.name) == folded or folded_name(info.distribution) == dist:
            raise OptiplugError(
                f"{name!r} is taken: plugin {info.name!r} ({info.distribution} {info.version}, "
                f"{info.status}) is installed; choose another name"
            )


def check_target(target: Path) -> None:
    """Refuse a ``DIR`` that exists and is not an empty directory, or has no parent.

    Args:
        target: where the plugin would be written.

    Raises:
        OptiplugError: ``target`` is a file, a non-empty directory, or its
            parent directory does not exist.
    """
    if target.is_dir():
        entries = sum(1 for _ in target.iterdir())
        if entries:
            raise OptiplugError(
                f"{target} is not empty ({entries} entries); give a new or empty directory"
            )
        return
    if target.exists() or target.is_symlink():
        raise OptiplugError(f"{target} exists and is not a directory")
    if not target.absolute().parent.is_dir():
        raise OptiplugError(f"the parent directory of {target} does not exist; create it first")


def core_requirement(version: str) -> str:
    """The requirement on the core a new plugin declares: this major.minor, below the next.

    Args:
        version: the running core's version (``"0.1.0"``).

    Returns:
        ``"optiplug>=0.1,<0.2"``; a version without a minor part counts as ``.0``.
    """
    found = re.match(r"(\d+)(?:\.(\d+))?", version)
    major, minor = (int(found[1]), int(found[2] or 0)) if found else (0, 0)
    return f"optiplug>={major}.{minor},<{major}.{minor + 1}"


def class_name(name: str) -> str:
    """The optimizer class name for ``name``: ``my_sgd`` -> ``MySgd``.

    Args:
        name: a valid plugin name.

    Returns:
        The CamelCase name, suffixed ``Optimizer`` when that would shadow a
        name the generated modules import (``tensor`` -> ``TensorOptimizer``).
    """
    camel = "".join(part[:1].upper() + part[1:] for part in name.split("_"))
    return f"{camel}Optimizer" if camel in _TAKEN_CLASS_NAMES else camel


# ------------------------------------------------------------------ rendering
def render(name: str, *, requirement: str | None = None) -> dict[str, str]:
    """The scaffold's files for plugin ``name``.

    Args:
        name: a valid plugin name (see :func:`check_name`).
        requirement: the core requirement to declare; by default
            :func:`core_requirement` of the running core.

    Returns:
        ``{relative POSIX path: text}`` for every file of the distribution.
    """
    package = f"optiplug_{name}"
    cls = class_name(name)
    values = {
        "name": name,
        "package": package,
        "dist": f"optiplug-{name}",
        "cls": cls,
        "config": f"{cls}Config",
        "api": str(PLUGIN_API_VERSION),
        "requirement": requirement or core_requirement(optiplug.__version__),
    }
    files = {
        "pyproject.toml": _PYPROJECT,
        "README.md": _README,
        ".gitignore": _GITIGNORE,
        f"src/{package}/__init__.py": _INIT,
        f"src/{package}/plugin.py": _PLUGIN,
        f"src/{package}/optimizer.py": _OPTIMIZER,
        f"src/{package}/py.typed": "",
        "tests/test_plugin.py": _TESTS,
    }
    return {path: Template(text).substitute(values) for path, text in files.items()}


# ------------------------------------------------------------------ writing
def write_tree(files: Mapping[str, str], target: Path) -> None:
    """Write ``files`` under ``target``, all or nothing.

    The files go into a new hidden staging directory (created with the
    user's umask) on the same file system: a sibling of ``target``, renamed
    to it once complete, or, when ``target`` is an existing empty directory,
    a subdirectory of it whose entries are then moved up (so the directory
    itself, its permissions and a shell's working directory in it, stay).
    On any failure the staging directory is removed and ``target`` is left
    as it was.

    Args:
        files: ``{relative POSIX path: text}``.
        target: a directory that does not exist or is empty.

    Raises:
        OptiplugError: a write or the final move failed.
    """
    target = Path(os.path.abspath(target))
    into_existing = target.is_dir()
    home = target if into_existing else target.parent
    staging = home / f".{target.name}.{secrets.token_hex(4)}.tmp"
    try:
        staging.mkdir()
    except OSError as error:
        raise OptiplugError(f"cannot write in {home}: {error}") from error
    try:
        for relative, text in files.items():
            _write(staging / relative, text)
        if into_existing:
            _move_entries(staging, target)
        else:
            os.rename(staging, target)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise OptiplugError(f"cannot write {target}: {error}") from error
        raise


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as stream:
        stream.write(text)


def _move_entries(staging: Path, target: Path) -> None:
    """Move the entries of ``staging`` into ``target``, then remove ``staging``.

    On failure the entries already moved go back, so ``target`` holds only
    ``staging`` again (which the caller removes).
    """
    moved: list[str] = []
    try:
        for entry in sorted(staging.iterdir()):
            os.rename(entry, target / entry.name)
            moved.append(entry.name)
    except BaseException:
        for name in reversed(moved):
            os.rename(target / name, staging / name)
        raise
    staging.rmdir()


# ------------------------------------------------------------------ templates
# string.Template placeholders: $name, $package, $dist, $cls, $config, $api, $requirement.

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "$cls (SGD with momentum), an optimizer plugin for optiplug"
readme = "README.md"
requires-python = ">=3.10"
# No license field yet: choose yours. With setuptools>=77, write an SPDX
# expression, e.g. license = "Apache-2.0" and license-files = ["LICENSE"], and
# raise the build requirement above to "setuptools>=77".
dependencies = ["$requirement", "torch>=2.4"]

# The entry-point name is the plugin's short name (OPTIPLUG_DISABLE_PLUGINS,
# provider=); the module holds the hook implementations and must not import torch.
[project.entry-points."optiplug.plugins"]
$name = "$package.plugin"

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
$package = ["py.typed"]

[tool.pytest.ini_options]
testpaths = ["tests"]

[tool.mypy]
strict = true
mypy_path = "src"
files = ["src", "tests"]

[tool.ruff]
line-length = 100
src = ["src"]

[tool.ruff.lint]
select = ["E", "F", "W", "I", "B", "UP", "SIM", "RUF"]
ignore = ["E501", "RUF022"]  # line length is the formatter's job; __all__ in any order

[tool.ruff.lint.isort]
known-first-party = ["$package"]
"""

_README = """\
# $dist

The `$name` optimizer for [optiplug](https://pypi.org/project/optiplug/): SGD
with momentum, with a `loop` and a `foreach` implementation sharing one state
slot, `momentum_buffer`. Per parameter `p` with gradient `g` and buffer `b`:

```
d = g + weight_decay * p
b = momentum * b + d
p = p - lr * b
```

Written by `optiplug new-plugin $name`: edit the kernels in
`src/$package/optimizer.py`, the hyperparameters in
`src/$package/plugin.py`, and the formula in `tests/test_plugin.py`.

## Install and use

```
pip install -e .
optiplug list                # $name, plugin $name, status active
optiplug show $name
```

```python
import optiplug

optimizer = optiplug.create("$name", model.parameters(), lr=0.01)
```

| hyperparameter | default | constraint |
|---|---|---|
| `lr` | 0.01 | finite, >= 0 |
| `momentum` | 0.9 | in [0, 1) |
| `weight_decay` | 0.0 | >= 0, added to the gradient |

`impl="loop"` or `impl="foreach"` forces an implementation; by default
optiplug measures both once per process and takes the faster.

## Layout

| file | what it holds |
|---|---|
| `src/$package/plugin.py` | the entry-point module: `$config`, the state layout and the records; no torch import, since `optiplug list` imports it |
| `src/$package/optimizer.py` | `$cls` on `optiplug.base.KernelTableOptimizer` and its two kernels |
| `src/$package/__init__.py` | re-exports; `$cls` is imported on first access |
| `tests/test_plugin.py` | `optiplug.testing`'s conformance checks and the update formula |

## Develop

```
pip install -e . pytest mypy ruff
pytest
mypy
ruff check . && ruff format --check .
```
"""

_GITIGNORE = """\
__pycache__/
*.egg-info/
build/
dist/
.mypy_cache/
.pytest_cache/
.ruff_cache/
"""

_INIT = '''\
"""$dist: the $name optimizer (SGD with momentum) for optiplug.

``$cls`` is a ``torch.optim.Optimizer`` with two implementations, ``loop``
and ``foreach``, sharing one state slot (``momentum_buffer``). Create it by
name with ``optiplug.create("$name", params)`` or import it from here.
Importing this package does not import torch: ``$cls`` is imported on first
access.
"""

from __future__ import annotations

from typing import Any

from .plugin import STATE_SLOTS, $config

__all__ = [
    "STATE_SLOTS",
    "$cls",
    "$config",
]


def __getattr__(name: str) -> Any:
    if name == "$cls":
        from .optimizer import $cls  # deferred: imports torch

        return $cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
'''

_PLUGIN = '''\
"""Entry-point module of $dist: config, state layout and records, no torch import.

``optiplug list`` imports this module, so it stays cheap: the optimizer class
is named by a lazy reference, imported only when an optimizer is created.
"""

from __future__ import annotations

import attrs
import optiplug
from optiplug.validators import hyperparameter, learning_rate, non_negative, unit_interval

__all__ = [
    "IMPLEMENTATIONS",
    "STATE_SLOTS",
    "$config",
    "implementation_specs",
]

OPTIPLUG_API = $api
"""The optiplug plugin API major version this module targets."""

_TARGET = "$package.optimizer:$cls"

IMPLEMENTATIONS: dict[str, tuple[int, str]] = {
    "foreach": (1, "torch._foreach_* ops over all tensors of a param group"),
    "loop": (0, "per-tensor torch ops"),
}
"""name -> (priority when not measured, description); the optimizer class reads it too."""

_SUPPORTS = {"foreach": "optiplug.base:foreach_supported"}


@attrs.frozen
class $config:
    """$cls hyperparameters; bad values raise ``HyperparameterError`` naming the field.

    Attributes:
        lr: learning rate.
        momentum: how much of the previous step the buffer keeps (0: plain SGD).
        weight_decay: L2 penalty, added to the gradient as ``weight_decay * p``.
    """

    lr: float = hyperparameter(0.01, learning_rate, "finite, >= 0")
    momentum: float = hyperparameter(0.9, unit_interval, "in [0, 1)")
    weight_decay: float = hyperparameter(0.0, non_negative, ">= 0 (added to the gradient)")


STATE_SLOTS = (
    optiplug.StateSlot("momentum_buffer", description="velocity: momentum * b + gradient"),
)
"""The state every implementation keeps, so a state dict moves freely between them."""


def implementation_specs() -> tuple[optiplug.ImplementationSpec, ...]:
    """The ``loop`` and ``foreach`` records of ``$name``.

    Returns:
        One :class:`optiplug.ImplementationSpec` per implementation; each
        factory lazily builds ``$cls`` forced to it.
    """
    return tuple(
        optiplug.ImplementationSpec(
            "$name",
            impl,
            optiplug.lazy(_TARGET, impl=impl),
            supports=optiplug.lazy(_SUPPORTS[impl]) if impl in _SUPPORTS else None,
            priority=priority,
            description=description,
        )
        for impl, (priority, description) in IMPLEMENTATIONS.items()
    )


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide ``$name``."""
    return [
        optiplug.OptimizerSpec(
            name="$name",
            factory=optiplug.lazy(_TARGET),
            config=$config,
            description=(
                "SGD with momentum: b = momentum*b + (g + weight_decay*p); p -= lr*b "
                "(torch.optim.SGD without dampening or Nesterov)."
            ),
            state_slots=STATE_SLOTS,
            implementations=implementation_specs(),
        )
    ]
'''

_OPTIMIZER = '''\
"""$cls: SGD with momentum, two kernels sharing one state slot.

Both kernels compute, per parameter ``p`` with gradient ``g`` and momentum
buffer ``b`` (state slot ``momentum_buffer``, zeros before the first step)::

    d = g + weight_decay * p
    b = momentum * b + d
    p = p - lr * b

which is ``torch.optim.SGD`` without dampening or Nesterov. Change the
kernels (and the formula in the tests) to make it your algorithm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch
from optiplug.base import Kernel, KernelTableOptimizer, Supports, foreach_supported
from torch import Tensor

from .plugin import IMPLEMENTATIONS, $config

__all__ = [
    "$cls",
    "sgd_momentum_foreach",
    "sgd_momentum_loop",
]


def sgd_momentum_loop(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor],
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
) -> None:
    """Apply one step tensor by tensor.

    Args:
        params: parameters, updated in place.
        grads: their gradients.
        momentum_buffers: their momentum buffers, updated in place.
        lr: learning rate.
        momentum: momentum factor.
        weight_decay: L2 penalty added to the gradient.
    """
    for param, grad, buffer in zip(params, grads, momentum_buffers, strict=True):
        direction = grad if weight_decay == 0 else grad.add(param, alpha=weight_decay)
        buffer.mul_(momentum).add_(direction)
        param.add_(buffer, alpha=-lr)


def sgd_momentum_foreach(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor],
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
) -> None:
    """Apply one step with ``torch._foreach_*`` ops over all tensors at once.

    Args:
        params: parameters, updated in place.
        grads: their gradients.
        momentum_buffers: their momentum buffers, updated in place.
        lr: learning rate.
        momentum: momentum factor.
        weight_decay: L2 penalty added to the gradient.
    """
    params, buffers = list(params), list(momentum_buffers)
    directions = list(grads)
    if weight_decay != 0:
        directions = list(torch._foreach_add(directions, params, alpha=weight_decay))
    torch._foreach_mul_(buffers, momentum)
    torch._foreach_add_(buffers, directions)
    torch._foreach_add_(params, buffers, alpha=-lr)


class $cls(KernelTableOptimizer):
    """SGD with momentum, with a ``loop`` and a ``foreach`` kernel.

    Args:
        params: tensors, param-group dicts or ``(name, tensor)`` pairs.
        lr: learning rate (default 0.01).
        impl: ``"loop"``, ``"foreach"``, or None to take the faster one,
            measured once per process.
        **hparams: ``momentum`` (default 0.9), ``weight_decay`` (default 0).

    Raises:
        HyperparameterError: an unknown keyword, a bad value, or an ``impl``
            that does not exist or cannot run ``params``.
    """

    algorithm = "$name"
    config_class = $config
    implementations: ClassVar[Mapping[str, Kernel]] = {
        "loop": sgd_momentum_loop,
        "foreach": sgd_momentum_foreach,
    }
    supports: ClassVar[Mapping[str, Supports]] = {"foreach": foreach_supported}
    priorities: ClassVar[Mapping[str, int]] = {n: p for n, (p, _) in IMPLEMENTATIONS.items()}
    descriptions: ClassVar[Mapping[str, str]] = {n: d for n, (_, d) in IMPLEMENTATIONS.items()}
    zero_state = ("momentum_buffer",)
'''

_TESTS = '''\
"""Tests of $dist as installed: optiplug's conformance checks and the update formula."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import optiplug
import pytest
import torch
from optiplug import testing

from $package.plugin import IMPLEMENTATIONS

NAME = "$name"
IMPLS = sorted(IMPLEMENTATIONS)


def test_the_plugin_is_discovered_and_active() -> None:
    info = {plugin.name: plugin for plugin in optiplug.plugins()}[NAME]
    assert info.status == "active", info.error
    registered = optiplug.default_registry().implementations(NAME)
    assert sorted(impl.name for impl in registered) == IMPLS


def test_the_entry_point_module_does_not_import_torch() -> None:
    code = "import sys, $package.plugin; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False"]


@pytest.mark.parametrize("impl", [None, *IMPLS])
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_conformance(check: Callable[..., None], impl: str | None) -> None:
    check(NAME, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
def test_steps_follow_the_formula(impl: str) -> None:
    lr, momentum, weight_decay = 0.1, 0.9, 0.01
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64))
    optimizer = optiplug.create(
        NAME, [param], lr=lr, momentum=momentum, weight_decay=weight_decay, impl=impl
    )
    expected = param.detach().clone()
    buffer = torch.zeros_like(expected)
    for grad in ([0.5, -1.0, 2.0], [-0.25, 0.5, 1.0], [1.0, 1.0, -1.0]):
        param.grad = torch.tensor(grad, dtype=torch.float64)
        optimizer.step()
        buffer = momentum * buffer + (param.grad + weight_decay * expected)
        expected = expected - lr * buffer
        torch.testing.assert_close(param.detach(), expected)
    torch.testing.assert_close(optimizer.state[param]["momentum_buffer"], buffer)
'''
