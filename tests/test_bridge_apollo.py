"""The apollo bridge: apollo-torch's APOLLOAdamW through optiplug, against the class itself.

Numerics are compared with the library class given the same groups: the
same kernels run on the same values in the same order (the random
projector draws from its own seeded generator), so the parameters must be
bit-equal (``torch.equal``), projection updates included.
"""

from __future__ import annotations

import inspect
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from bridge_steps import run, same

import optiplug
from optiplug import checkpoint, testing
from optiplug.errors import CheckpointError, HyperparameterError
from optiplug_apollo.catalog import PARAMS, PROJECTORS

apollo_torch = pytest.importorskip("apollo_torch")

GAP = 2  # the projection is renewed at steps 0, 2, 4...


def network() -> torch.nn.Sequential:
    """Matrices of both orientations and vectors."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def groups(model: torch.nn.Sequential, **projection: Any) -> list[Any]:
    """transformers' layout: the other parameters first, then the projected matrices."""
    keys = {
        "rank": 2,
        "proj": "random",
        "scale_type": "channel",
        "update_proj_gap": GAP,
        "scale": 1.0,
        "proj_type": "std",
        **projection,
    }
    matrices = [model[0].weight, model[2].weight]
    return [{"params": [model[0].bias, model[2].bias]}, {"params": matrices, **keys}]


VARIANTS = [
    {},
    {"proj": "svd"},
    {"scale_type": "tensor"},
    {"proj_type": "reverse_std", "scale": 4.0, "scale_type": "tensor"},
    {"proj": "svd", "proj_type": "left", "scale_type": "tensor"},
    {"proj_type": "right", "scale_type": "tensor"},
]


def test_the_catalogue_matches_the_installed_class() -> None:
    signature = inspect.signature(apollo_torch.APOLLOAdamW.__init__).parameters
    assert [p.name for p in PARAMS] == [n for n in signature if n not in ("self", "params")]
    for param in PARAMS:
        assert signature[param.name].default == param.default, param.name
    random = apollo_torch.random_projector.GradientProjector(2)
    svd = apollo_torch.svd_projector.GaLoreProjector(2)
    assert set(vars(random)) == set(PROJECTORS["random"][1])
    assert set(vars(svd)) == set(PROJECTORS["svd"][1])


@pytest.mark.parametrize("projection", VARIANTS)
@pytest.mark.parametrize("keywords", [{}, {"scale_front": True}, {"disable_nl": True}])
def test_steps_are_bit_equal_to_the_library_class(
    projection: dict[str, Any], keywords: dict[str, Any]
) -> None:
    left, right = network(), network()
    mine = optiplug.create("apollo:apollo_adamw", groups(left, **projection), lr=0.01, **keywords)
    theirs = apollo_torch.APOLLOAdamW(groups(right, **projection), lr=0.01, **keywords)
    run(mine, left, 0, 5)
    run(theirs, right, 0, 5)
    assert same(left, right)
    assert mine.state[left[0].weight]["projector"].ortho_matrix is not None


@pytest.mark.parametrize("proj", ["random", "svd"])
def test_a_weights_only_state_dict_resumes_bit_equal(proj: str) -> None:
    """3 steps, save through torch.save / weights_only load, 3 more: as 6 uninterrupted.

    The random projector's next seed is state: a resume that lost it would draw
    another matrix at step 4.
    """
    model = network()
    original = optiplug.create("apollo:apollo_adamw", groups(model, proj=proj), lr=0.01)
    run(original, model, 0, 3)
    buffer = io.BytesIO()
    torch.save(original.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    twin = network()
    twin.load_state_dict(model.state_dict())
    resumed = optiplug.create("apollo:apollo_adamw", groups(twin, proj=proj), lr=0.01)
    resumed.load_state_dict(saved)
    kind = PROJECTORS[proj][0]
    assert type(resumed.state[twin[0].weight]["projector"]).__name__ == kind
    run(original, model, 3, 3)
    run(resumed, twin, 3, 3)
    assert same(model, twin)


def test_an_optiplug_checkpoint_resumes_bit_equal(tmp_path: Path) -> None:
    model = network()
    original = optiplug.create("apollo:apollo_adamw", groups(model), lr=0.01)
    run(original, model, 0, 3)
    checkpoint.save(tmp_path / "ckpt", original)
    twin = network()
    twin.load_state_dict(model.state_dict())
    resumed = optiplug.create("apollo:apollo_adamw", groups(twin), lr=0.01)
    assert checkpoint.load(tmp_path / "ckpt", resumed).problems == ()
    run(original, model, 3, 3)
    run(resumed, twin, 3, 3)
    assert same(model, twin)


def test_a_fresh_optimizer_saves_and_loads_its_seeds(tmp_path: Path) -> None:
    """APOLLOAdamW keeps a seed per parameter from construction, before any step."""
    model = network()
    optimizer = optiplug.create("apollo:apollo_adamw", groups(model), lr=0.01)
    checkpoint.save(tmp_path / "ckpt", optimizer)
    fresh = optiplug.create("apollo:apollo_adamw", groups(network()), lr=0.01)
    assert checkpoint.load(tmp_path / "ckpt", fresh).problems == ()


def test_a_projector_it_cannot_store_is_refused_at_save(tmp_path: Path) -> None:
    model = network()
    optimizer = optiplug.create("apollo:apollo_adamw", groups(model), lr=0.01)
    run(optimizer, model, 0, 1)
    optimizer.state[model[0].weight]["projector"].cache = object()  # a later release's field
    with pytest.raises(CheckpointError, match="cache"):
        checkpoint.save(tmp_path / "ckpt", optimizer)
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rank": 0}, "rank"),
        ({"update_proj_gap": 1.5}, "update_proj_gap"),
        ({"scale": -1.0}, "scale"),
        ({"proj": "dct"}, "proj"),
        ({"scale_type": "row"}, "scale_type"),
        ({"proj_type": "full"}, "proj_type"),
    ],
)
def test_bad_projection_keys_are_typed_errors(change: dict[str, Any], field: str) -> None:
    with pytest.raises(HyperparameterError) as raised:
        optiplug.create("apollo:apollo_adamw", groups(network(), **change), lr=0.01)
    assert raised.value.field == field and "param group 1" in raised.value.reason


@pytest.mark.parametrize("proj_type", ["reverse_std", "right"])
def test_channel_scaling_along_the_wrong_side_is_refused_before_the_library_fails(
    proj_type: str,
) -> None:
    """Channel scaling divides norms over the side the projection keeps: the library
    fails in its first step otherwise (a shape error); here it is refused when built."""
    with pytest.raises(HyperparameterError, match="scale_type='channel'") as raised:
        optiplug.create("apollo:apollo_adamw", groups(network(), proj_type=proj_type))
    assert raised.value.field == "proj_type"
    model = network()
    library = apollo_torch.APOLLOAdamW(groups(model, proj_type=proj_type))
    with pytest.raises(RuntimeError, match="size of tensor"):
        run(library, model, 0, 1)


def test_a_projected_group_needs_every_key_and_only_matrices() -> None:
    model = network()
    with pytest.raises(HyperparameterError, match="needs rank, proj") as raised:
        optiplug.create("apollo:apollo_adamw", [{"params": [model[0].weight], "rank": 2}])
    assert raised.value.field == "proj"
    vectors = [{**groups(model)[1], "params": [model[0].bias]}]
    with pytest.raises(HyperparameterError, match="matrices"):
        optiplug.create("apollo:apollo_adamw", vectors, lr=0.01)


@pytest.mark.parametrize(
    ("hparams", "field"),
    [({"lr": float("inf")}, "lr"), ({"eps": -1e-8}, "eps"), ({"scale_front": 1}, "scale_front")],
)
def test_bad_hyperparameters_are_typed_errors(hparams: dict[str, Any], field: str) -> None:
    with pytest.raises(HyperparameterError) as raised:
        optiplug.create("apollo:apollo_adamw", network().parameters(), **hparams)
    assert raised.value.field == field


# ------------------------------------------------------------------ conformance
@pytest.mark.parametrize("name", ["apollo_adamw"])
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda check: check.__name__)
def test_conformance(name: str, check: Any) -> None:
    """optiplug's conformance suite (plain tensors, no projected group: the plain method).

    A step without gradients moves nothing, but the state is not empty: the
    constructor gives every parameter its ``seed`` (the random projector's
    first), before any step, so that part of the no-grad check cannot hold.
    """
    if check is testing.check_no_grad_step_is_noop:
        model = network()
        optimizer = optiplug.create(f"apollo:{name}", groups(model), lr=0.01)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert all(set(entry) == {"seed"} for entry in optimizer.state.values())
        return
    check(f"apollo:{name}")
