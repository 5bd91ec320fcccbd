"""The grokadamw bridge: GrokAdamW through optiplug, against the library class itself.

The same kernels run on the same values in the same order, so the
parameters must be bit-equal (``torch.equal``). The library keeps its state
inside the param groups; the bridge keeps the same dicts in
``optimizer.state``, which is what makes a resume equal.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from bridge_steps import run, same

import optiplug
from optiplug import checkpoint, testing
from optiplug.errors import HyperparameterError
from optiplug_grokadamw.catalog import PARAMS

grokadamw = pytest.importorskip("grokadamw")


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """The library's step enters CUDA autocast, which warns on a CPU-only machine."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, message=".*autocast")
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*autocast")
        yield


def network() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def groups(model: torch.nn.Sequential) -> list[Any]:
    """The Trainer's layout: the decayed matrices, then the vectors without decay."""
    return [
        {"params": [model[0].weight, model[2].weight], "weight_decay": 0.01},
        {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0},
    ]


def test_the_catalogue_matches_the_installed_class() -> None:
    signature = inspect.signature(grokadamw.GrokAdamW.__init__).parameters
    assert [p.name for p in PARAMS] == [n for n in signature if n not in ("self", "params")]
    for param in PARAMS:
        assert signature[param.name].default == param.default, param.name


@pytest.mark.parametrize(
    "keywords",
    [{}, {"lamb": 5.0, "gamma": 0.5, "gradient_clipping": 0.0}, {"alpha_init": 0.5}],
)
def test_steps_are_bit_equal_to_the_library_class(keywords: dict[str, Any]) -> None:
    left, right = network(), network()
    mine = optiplug.create("grokadamw:grokadamw", groups(left), lr=0.01, **keywords)
    theirs = grokadamw.GrokAdamW(groups(right), lr=0.01, **keywords)
    run(mine, left, 0, 4)
    run(theirs, right, 0, 4)
    assert same(left, right)
    assert len(mine.state) == 4 and all("state" not in g for g in mine.param_groups)


def test_a_grokking_signal_steps_as_in_the_library() -> None:
    left, right = network(), network()
    signal = [lambda: 0.5]
    mine = optiplug.create("grokadamw:grokadamw", groups(left), grokking_signal_fns=signal)
    theirs = grokadamw.GrokAdamW(groups(right), grokking_signal_fns=signal)
    run(mine, left, 0, 3)
    run(theirs, right, 0, 3)
    assert same(left, right)


def test_a_checkpoint_resumes_bit_equal_and_keeps_the_signal_functions(tmp_path: Path) -> None:
    """The library's own state dict keeps the state in the groups and loses it on load."""
    signal = [lambda: 0.25]
    model = network()
    original = optiplug.create("grokadamw:grokadamw", groups(model), grokking_signal_fns=signal)
    run(original, model, 0, 3)
    checkpoint.save(tmp_path / "ckpt", original)
    twin = network()
    twin.load_state_dict(model.state_dict())
    resumed = optiplug.create("grokadamw:grokadamw", groups(twin), grokking_signal_fns=signal)
    notes = checkpoint.load(tmp_path / "ckpt", resumed).problems
    # the only notes: the saved None differs from the functions, which are kept
    assert {(n.slot, n.kind) for n in notes} == {("grokking_signal_fns", "hyperparameter-changed")}
    assert all(list(g["grokking_signal_fns"]) == signal for g in resumed.param_groups)
    run(original, model, 3, 3)
    run(resumed, twin, 3, 3)
    assert same(model, twin)


@pytest.mark.parametrize(
    ("hparams", "field"),
    [
        ({"alpha_init": 1.5}, "alpha_init"),
        ({"gamma": -0.1}, "gamma"),
        ({"lamb": float("nan")}, "lamb"),
        ({"gradient_clipping": -1.0}, "gradient_clipping"),
        ({"grokking_signal_fns": [1.0]}, "grokking_signal_fns"),
        ({"eps": 0.0}, "eps"),
    ],
)
def test_bad_hyperparameters_are_typed_errors(hparams: dict[str, Any], field: str) -> None:
    with pytest.raises(HyperparameterError) as raised:
        optiplug.create("grokadamw:grokadamw", network().parameters(), **hparams)
    assert raised.value.field == field


# ------------------------------------------------------------------ conformance
@pytest.mark.parametrize("name", ["grokadamw"])
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_conformance(name: str, check: Any) -> None:
    """optiplug's conformance suite (plain tensors, no projected group: the plain method)."""
    check(f"grokadamw:{name}")
