"""``no_decay="auto"`` and ``layer_decay`` give timm's own param groups on timm's models.

timm is the reference: for each model, timm's ``param_groups_layer_decay`` /
``param_groups_weight_decay`` and optiplug's ``param_groups`` must give every
parameter the same (lr scale, weight decay), in the same number of groups.
Both sides compute ``layer_decay ** (top - layer_id)`` with one Python float
power from the same operands, so the comparison is exact.

timm needs torchvision, which does not load beside every torch build, so this
module skips where timm does not import. Run it in an environment where it
does (see docs/param_groups.md)::

    python -m pip install timm torchvision  # a matching pair for the torch there
    python -m pytest -n 0 -p no:cacheprovider tests/test_timm_conventions.py
"""

from __future__ import annotations

from typing import Any

import pytest

from optiplug.base import param_groups

try:
    timm = pytest.importorskip("timm", exc_type=ImportError)
    timm_optim = pytest.importorskip("timm.optim", exc_type=ImportError)
except RuntimeError as exc:  # a torchvision built for another torch fails to register its ops
    pytest.skip(f"timm does not import beside this torch: {exc}", allow_module_level=True)

MODELS = ["resnet18", "convnext_atto", "vit_tiny_patch16_224"]
WEIGHT_DECAY = 0.05
LAYER_DECAY = 0.8


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> Any:
    """Each model built once (random weights: the grouping reads names and shapes only)."""
    return timm.create_model(request.param, pretrained=False)


def _timm_no_weight_decay(model: Any) -> set[str]:
    """What timm's ``create_optimizer_v2`` passes as ``no_weight_decay_list``."""
    return set(getattr(model, "no_weight_decay", set)())


def _timm_settings(groups: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """``id(param) -> (lr_scale, weight_decay)`` of timm's groups (no lr_scale: 1.0)."""
    return {
        id(p): (float(g.get("lr_scale", 1.0)), float(g["weight_decay"]))
        for g in groups
        for p in g["params"]
    }


def _ours(model: Any, **grouping: Any) -> tuple[int, dict[int, tuple[float, float]]]:
    """``(number of groups, id(param) -> (lr scale, weight decay))`` from optiplug.

    With a base lr of 1.0 a group's ``lr`` is ``1.0 * scale``, the scale
    itself; a group without an ``lr`` or ``weight_decay`` key keeps the base.
    """
    groups = param_groups(model, hparams={"lr": 1.0, "weight_decay": WEIGHT_DECAY}, **grouping)
    settings = {
        id(p): (float(g.get("lr", 1.0)), float(g.get("weight_decay", WEIGHT_DECAY)))
        for g in groups
        for _, p in g["params"]
    }
    return len(groups), settings


def _disagreements(
    model: Any, theirs: dict[int, tuple[float, float]], ours: dict[int, tuple[float, float]]
) -> list[tuple[str, tuple[float, float], tuple[float, float]]]:
    return [
        (name, theirs[id(p)], ours[id(p)])
        for name, p in model.named_parameters()
        if theirs[id(p)] != ours[id(p)]
    ]


def test_layer_decay_equals_timm_param_groups_layer_decay(model: Any) -> None:
    theirs = timm_optim.param_groups_layer_decay(
        model,
        weight_decay=WEIGHT_DECAY,
        layer_decay=LAYER_DECAY,
        no_weight_decay_list=_timm_no_weight_decay(model),
    )
    count, ours = _ours(model, no_decay="auto", layer_decay=LAYER_DECAY)
    assert _disagreements(model, _timm_settings(theirs), ours) == []
    assert count == len(theirs)
    # more than one layer, or the comparison would prove little
    assert len({scale for scale, _ in ours.values()}) > 2


def test_auto_equals_timm_param_groups_weight_decay(model: Any) -> None:
    theirs = timm_optim.param_groups_weight_decay(
        model, weight_decay=WEIGHT_DECAY, no_weight_decay_list=_timm_no_weight_decay(model)
    )
    count, ours = _ours(model, no_decay="auto")
    assert _disagreements(model, _timm_settings(theirs), ours) == []
    assert count == len(theirs) == 2
