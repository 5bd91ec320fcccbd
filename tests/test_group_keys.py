"""Param-group keys an algorithm does not know pass through untouched, as in torch.optim.

timm's ``param_groups_layer_decay`` gives each group an ``lr_scale`` (its
schedulers multiply the lr by it); users tag groups with names of their
own. torch's optimizers keep such keys in ``param_groups`` and ignore them;
so does every optiplug optimizer, while a misspelt *keyword* of ``create``
is still refused.
"""

from __future__ import annotations

import pytest
import torch

import optiplug
from optiplug import checkpoint
from optiplug.errors import HyperparameterError

NAMES = [
    "adam",
    "adamw",
    "sgd",
    "lion",
    "muon",
    "adan",
    "torchao:adamw8bit",
    "bitsandbytes:adamw8bit",
    "adamw_schedulefree",
    "galore:galore_adamw",
    "apollo:apollo_adamw",
    "grokadamw:grokadamw",
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64))


def _layer_decay_groups(model: torch.nn.Module) -> list[dict[str, object]]:
    """The groups timm's ``param_groups_layer_decay`` returns, built by hand (timm cannot
    install beside the CPU torch here): ``lr_scale``, ``weight_decay``, ``param_names``."""
    groups = []
    for index, scale in ((0, 0.5), (2, 1.0)):
        named = list(model[index].named_parameters(prefix=str(index)))
        groups.append(
            {
                "lr_scale": scale,
                "weight_decay": 0.0 if index == 0 else 0.01,
                "param_names": [name for name, _ in named],
                "params": [param for _, param in named],
                "layer": f"block{index}",
            }
        )
    return groups


def _train(optimizer: torch.optim.Optimizer, model: torch.nn.Module, steps: int) -> None:
    if callable(getattr(optimizer, "train", None)):
        optimizer.train()  # type: ignore[attr-defined]
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 64, generator=generator)).square().mean().backward()
        optimizer.step()


@pytest.mark.parametrize("name", NAMES)
def test_unknown_group_keys_are_kept_stepped_past_and_resumed(name: str, tmp_path) -> None:
    model = _model()
    optimizer = optiplug.create(name, _layer_decay_groups(model), lr=1e-3)
    _train(optimizer, model, 2)
    scales = {g["lr_scale"] for g in optimizer.param_groups}
    assert scales == {0.5, 1.0} and {g["layer"] for g in optimizer.param_groups} == {
        "block0",
        "block2",
    }
    checkpoint.save(tmp_path / "ckpt", optimizer)
    resumed = optiplug.create(name, _layer_decay_groups(model), lr=1e-3)
    checkpoint.load(tmp_path / "ckpt", resumed)
    assert [g["lr_scale"] for g in resumed.param_groups] == [
        g["lr_scale"] for g in optimizer.param_groups
    ]


def test_adamw_with_unknown_group_keys_equals_torch_bit_for_bit() -> None:
    ours_model, torch_model = _model(), _model()
    ours = optiplug.create("adamw", _layer_decay_groups(ours_model), lr=1e-3, impl="foreach")
    theirs = torch.optim.AdamW(_layer_decay_groups(torch_model), lr=1e-3, foreach=True)
    _train(ours, ours_model, 3)
    _train(theirs, torch_model, 3)
    for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_misspelt_keyword_and_a_bad_known_group_value_are_still_refused() -> None:
    model = _model()
    with pytest.raises(HyperparameterError, match="did you mean 'weight_decay'"):
        optiplug.create("adamw", _layer_decay_groups(model), lr=1e-3, weight_decya=0.1)
    groups = _layer_decay_groups(model)
    groups[0]["weight_decay"] = -1.0
    with pytest.raises(HyperparameterError, match=r"weight_decay=-1\.0"):
        optiplug.create("adamw", groups, lr=1e-3)
