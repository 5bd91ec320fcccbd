"""Bridges under fault: a bridged library missing at import, a closure optimizer stepped bare.

Both leave everything else working and say what to do: the plugin whose
library is missing is ``unavailable`` naming what to install (the other
plugins and their optimizers are untouched), and ``step()`` without the
closure an optimizer needs raises a typed error before anything changes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

import optiplug
from optiplug.errors import ClosureRequiredError, GraphError, PluginConflictError

# ------------------------------------------------------------------ a bridged library missing
LIBRARIES = {
    # the import name: (its plugin, what pip installs, one of its optimizers)
    "torchao": ("torchao", "torchao", "torchao:adamw8bit"),
    "heavyball": ("heavyball", "heavyball", "heavyball:soap"),
    "pytorch_optimizer": ("pytorch_optimizer", "pytorch-optimizer", "adan"),
    "schedulefree": ("schedulefree", "schedulefree", "adamw_schedulefree"),
}
MISSING_CHILD = """
import json, sys
missing = sys.argv[1]
sys.modules[missing] = None  # what an import finds for a package that is not installed
import torch, optiplug
from optiplug.errors import OptimizerUnavailableError
plugin, _, name = json.loads(sys.argv[2])
registry = optiplug.default_registry()
param = torch.nn.Parameter(torch.ones(4, 4))
try:
    optiplug.create(name, [param], lr=0.01)
    outcome = "created"
except OptimizerUnavailableError as error:
    outcome = str(error)
optiplug.create("adamw", [param], lr=0.01)  # the others keep working
info = {i.name: (i.status, i.error) for i in registry.plugins()}
print(json.dumps({"create": outcome, "plugin": info[plugin], "adamw": info["adamw"][0],
                  "imported": missing in sys.modules and sys.modules[missing] is not None}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("missing", sorted(LIBRARIES))
def test_a_bridged_library_missing_makes_its_plugin_unavailable_naming_what_to_install(
    missing: str,
) -> None:
    _, distribution, name = LIBRARIES[missing]
    child = subprocess.run(
        [sys.executable, "-c", MISSING_CHILD, missing, json.dumps(LIBRARIES[missing])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr
    seen = json.loads(child.stdout.strip().splitlines()[-1])
    install = f"pip install {distribution}"
    assert seen["plugin"] == ["unavailable", f"{missing} is not installed: {install}"]
    assert install in seen["create"] and f"{name.rpartition(':')[2]!r}" in seen["create"]
    assert seen["adamw"] == "active" and not seen["imported"]


# ------------------------------------------------------------------ stepping without a closure
def _closure_specs() -> list[str]:
    """Every closure optimizer's name, qualified where several plugins serve it (lbfgs)."""
    registry = optiplug.default_registry()
    clashes = registry.clashes()
    names = set()
    for spec in registry.optimizer_specs():
        if spec.step_closure:
            names.update(clashes.get(spec.name, (spec.name,)))
    return sorted(names)


@pytest.mark.parametrize("name", _closure_specs())
def test_a_closure_optimizer_stepped_without_one_raises_typed_with_nothing_changed(
    name: str,
) -> None:
    spec = optiplug.default_registry().spec(name)
    param = torch.nn.Parameter(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))
    optimizer = optiplug.create(name, [param], **spec.example_hparams)
    param.grad = torch.ones_like(param)
    value = param.detach().clone()
    with pytest.raises(ClosureRequiredError, match=r"step\(\) needs a closure") as raised:
        optimizer.step()
    assert isinstance(raised.value, TypeError)
    assert torch.equal(param, value) and not optimizer.state
    loss = optiplug.base.training_step(optimizer, lambda: param.square().sum())  # then it steps
    assert math.isfinite(float(loss)) and optimizer.state  # (radam's first step moves nothing)


# ------------------------------------------------------------------ clashing names, Graph
def _clashes(registry: optiplug.Registry, name: str) -> bool:
    """Whether ``name`` alone is a clash (no native algorithm of that name wins)."""
    try:
        registry.spec(name)
    except PluginConflictError:
        return True
    return False


def test_a_name_two_bridges_serve_is_a_typed_clash_and_each_qualified_name_builds() -> None:
    registry = optiplug.default_registry()
    clashes = {n: q for n, q in registry.clashes().items() if _clashes(registry, n)}
    assert clashes  # heavyball and pytorch-optimizer both serve adopt, laprop, ademamix...
    name, qualified = sorted(clashes.items())[0]
    param = torch.nn.Parameter(torch.ones(4, 4))
    with pytest.raises(PluginConflictError, match=f"qualified name: {qualified[0]!r}"):
        optiplug.create(name, [param], lr=1e-3)
    assert torch.equal(param, torch.ones(4, 4))  # nothing was built, nothing stepped
    for each in qualified:  # every provider stays reachable, and steps
        optimizer = optiplug.create(each, [param], lr=1e-3)
        optiplug.base.training_step(optimizer, lambda: param.square().sum())


def test_graph_refuses_a_closure_optimizer_and_keeps_the_one_it_had() -> None:
    model = torch.nn.Linear(4, 1)
    graph = optiplug.Graph(model)
    kept = graph.set_optimizer(optiplug.factory("adamw", lr=1e-3))
    with pytest.raises(GraphError, match="training_step"):
        graph.set_optimizer(optiplug.factory("torch:lbfgs"))
    assert graph.optimizer is kept
    graph.backward(model(torch.ones(2, 4)).sum())  # and it still trains with it
    assert graph.step()
