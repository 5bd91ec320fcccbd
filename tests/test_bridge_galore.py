"""The galore bridge: galore-torch's classes through optiplug, against the classes themselves.

Numerics are compared with the library class given the same groups: the
same kernels run on the same values in the same order, so the parameters
must be bit-equal (``torch.equal``), projection updates included.
"""

from __future__ import annotations

import inspect
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from bridge_steps import run, same

import optiplug
from optiplug import checkpoint, testing
from optiplug.errors import CheckpointError, HyperparameterError
from optiplug_galore.catalog import CATALOG, PROJECTOR_FIELDS

galore_torch = pytest.importorskip("galore_torch")

GAP = 2  # the projection is recomputed at steps 0, 2, 4...


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    """galore-torch's AdamW warns that "this implementation of AdamW is deprecated"."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "This implementation of AdamW", FutureWarning)
        yield


def network() -> torch.nn.Sequential:
    """Matrices of both orientations (6x8: wide, 3x6: tall after the transpose) and vectors."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def groups(model: torch.nn.Sequential, proj_type: str = "std", **extra: Any) -> list[Any]:
    matrices = [model[0].weight, model[2].weight]
    vectors = [model[0].bias, model[2].bias]
    projected = {"rank": 2, "update_proj_gap": GAP, "scale": 0.25, "proj_type": proj_type}
    return [{"params": matrices, **projected, **extra}, {"params": vectors}]


KEYWORDS = {"galore_adamw": {"lr": 0.01}, "galore_adafactor": {"lr": 0.01, "relative_step": False}}
CLASSES = {"galore_adamw": "GaLoreAdamW", "galore_adafactor": "GaLoreAdafactor"}
PROJ_TYPES = ["std", "reverse_std", "left", "right", "full"]


def test_the_catalogue_matches_the_installed_classes() -> None:
    """Every bridged keyword exists with the library's default (a new release fails here)."""
    for item in CATALOG:
        signature = inspect.signature(getattr(galore_torch, item.cls).__init__).parameters
        for param in item.params:
            assert signature[param.name].default == param.default, (item.name, param.name)
    projector = galore_torch.galore_projector.GaLoreProjector(2)
    assert set(vars(projector)) == set(PROJECTOR_FIELDS)


@pytest.mark.parametrize("proj_type", PROJ_TYPES)
@pytest.mark.parametrize("name", sorted(KEYWORDS))
def test_steps_are_bit_equal_to_the_library_class(name: str, proj_type: str) -> None:
    left, right = network(), network()
    mine = optiplug.create(f"galore:{name}", groups(left, proj_type), **KEYWORDS[name])
    theirs = getattr(galore_torch, CLASSES[name])(groups(right, proj_type), **KEYWORDS[name])
    run(mine, left, 0, 5)
    run(theirs, right, 0, 5)
    assert same(left, right)
    projector = mine.state[left[0].weight]["projector"]
    assert projector.ortho_matrix is not None  # projected, not stepped in full


@pytest.mark.parametrize("proj_type", ["std", "full"])
@pytest.mark.parametrize("name", sorted(KEYWORDS))
def test_a_weights_only_state_dict_resumes_bit_equal(name: str, proj_type: str) -> None:
    """3 steps, save through torch.save / weights_only load, 3 more: as 6 uninterrupted."""
    model = network()
    original = optiplug.create(f"galore:{name}", groups(model, proj_type), **KEYWORDS[name])
    run(original, model, 0, 3)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    twin = network()
    twin.load_state_dict(model.state_dict())
    resumed = optiplug.create(f"galore:{name}", groups(twin, proj_type), **KEYWORDS[name])
    resumed.load_state_dict(saved)
    assert type(resumed.state[twin[0].weight]["projector"]).__name__ == "GaLoreProjector"
    run(original, model, 3, 3)
    run(resumed, twin, 3, 3)
    assert same(model, twin)


def test_an_optiplug_checkpoint_resumes_bit_equal(tmp_path: Path) -> None:
    model = network()
    original = optiplug.create("galore:galore_adamw", groups(model), lr=0.01)
    run(original, model, 0, 3)
    checkpoint.save(tmp_path / "ckpt", original)
    twin = network()
    twin.load_state_dict(model.state_dict())
    resumed = optiplug.create("galore:galore_adamw", groups(twin), lr=0.01)
    assert checkpoint.load(tmp_path / "ckpt", resumed).problems == ()
    run(original, model, 3, 3)
    run(resumed, twin, 3, 3)
    assert same(model, twin)


def test_a_projector_it_cannot_store_is_refused_at_save(tmp_path: Path) -> None:
    """A projector with an attribute the bridge does not know: a typed error, no file."""
    model = network()
    optimizer = optiplug.create("galore:galore_adamw", groups(model), lr=0.01)
    run(optimizer, model, 0, 1)
    optimizer.state[model[0].weight]["projector"].cache = object()  # a later release's field
    with pytest.raises(CheckpointError, match="cache"):
        optimizer.state_dict()
    with pytest.raises(CheckpointError, match="cache"):
        checkpoint.save(tmp_path / "ckpt", optimizer)
    assert not (tmp_path / "ckpt").exists()


def test_unknown_group_keys_pass_through_untouched() -> None:
    model = network()
    optimizer = optiplug.create("galore:galore_adamw", groups(model, tag="matrices"), lr=0.01)
    assert optimizer.param_groups[0]["tag"] == "matrices"
    assert "rank" not in optimizer.param_groups[1]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rank": 0}, "rank"),
        ({"rank": 2.5}, "rank"),
        ({"update_proj_gap": -1}, "update_proj_gap"),
        ({"scale": float("nan")}, "scale"),
        ({"proj_type": "diagonal"}, "proj_type"),
    ],
)
def test_bad_projection_keys_are_typed_errors(change: dict[str, Any], field: str) -> None:
    model = network()
    given = groups(model)
    given[0].update(change)
    with pytest.raises(HyperparameterError) as raised:
        optiplug.create("galore:galore_adamw", given, lr=0.01)
    assert raised.value.field == field and "param group 0" in raised.value.reason


def test_a_projected_group_needs_every_key_and_only_matrices() -> None:
    model = network()
    with pytest.raises(HyperparameterError, match="needs rank, update_proj_gap") as raised:
        optiplug.create("galore:galore_adamw", [{"params": [model[0].weight], "rank": 2}])
    assert raised.value.field == "update_proj_gap"
    vector = [{**groups(model)[0], "params": list(model.named_parameters())}]
    with pytest.raises(HyperparameterError, match=r"0\.bias of shape \(6,\)"):
        optiplug.create("galore:galore_adamw", vector, lr=0.01)


@pytest.mark.parametrize(
    ("name", "hparams", "field"),
    [
        ("galore_adamw", {"lr": -1.0}, "lr"),
        ("galore_adamw", {"betas": (0.9, 1.0)}, "betas"),
        ("galore_adamw", {"eps": 0.0}, "eps"),
        ("galore_adafactor", {"lr": 0.01}, "relative_step"),  # relative_step=True by default
        ("galore_adafactor", {"warmup_init": True, "relative_step": False}, "warmup_init"),
        ("galore_adafactor", {"eps": (1e-30,)}, "eps"),
    ],
)
def test_bad_hyperparameters_are_typed_errors(
    name: str, hparams: dict[str, Any], field: str
) -> None:
    with pytest.raises(HyperparameterError) as raised:
        optiplug.create(f"galore:{name}", network().parameters(), **hparams)
    assert raised.value.field == field


def eight_bit_network() -> torch.nn.Sequential:
    """A 64x64 matrix: bitsandbytes keeps 8-bit state from 4096 elements (min_8bit_size)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 3))  # fmt: skip


def eight_bit_groups(model: torch.nn.Sequential) -> list[Any]:
    projected = {"rank": 4, "update_proj_gap": GAP, "scale": 0.25, "proj_type": "std"}
    square = model[2].weight
    return [
        {"params": [square], **projected},
        {"params": [p for p in model.parameters() if p is not square]},
    ]


def test_the_8bit_class_without_projection_is_bitsandbytes_adamw8bit() -> None:
    """No group with a rank: the library's step is bitsandbytes' own 8-bit AdamW (the peer)."""
    bnb = pytest.importorskip("bitsandbytes")
    left, right = eight_bit_network(), eight_bit_network()
    mine = optiplug.create("galore:galore_adamw_8bit", left.parameters(), lr=0.01)
    theirs = bnb.optim.AdamW8bit(right.parameters(), lr=0.01)
    run(mine, left, 0, 4)
    run(theirs, right, 0, 4)
    assert same(left, right)
    assert mine.state[left[2].weight]["state1"].dtype == torch.uint8  # 8-bit state ran


def test_the_8bit_class_is_bit_equal_to_the_library_and_resumes(tmp_path: Path) -> None:
    """Projected: the library's class itself (where CUDA is absent its step needs the same
    no-op synchronisation the bridge gives it), and a checkpoint resume."""
    from optiplug_galore.optimizers import without_cuda_synchronize

    left, right = eight_bit_network(), eight_bit_network()
    mine = optiplug.create("galore:galore_adamw_8bit", eight_bit_groups(left), lr=0.01)
    theirs = galore_torch.GaLoreAdamW8bit(eight_bit_groups(right), lr=0.01)
    run(mine, left, 0, 3)
    with without_cuda_synchronize():
        run(theirs, right, 0, 3)
    assert same(left, right)
    checkpoint.save(tmp_path / "ckpt", mine)
    twin = eight_bit_network()
    twin.load_state_dict(left.state_dict())
    resumed = optiplug.create("galore:galore_adamw_8bit", eight_bit_groups(twin), lr=0.01)
    assert checkpoint.load(tmp_path / "ckpt", resumed).problems == ()
    run(mine, left, 3, 3)
    run(resumed, twin, 3, 3)
    assert same(left, twin)


# ------------------------------------------------------------------ conformance
@pytest.mark.parametrize("name", ["galore_adamw", "galore_adamw_8bit", "galore_adafactor"])
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_conformance(name: str, check: Any) -> None:
    """optiplug's conformance suite (plain tensors, no projected group: the plain method)."""
    check(f"galore:{name}")
