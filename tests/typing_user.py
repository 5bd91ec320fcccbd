"""User code that ``mypy --strict`` must accept: the public API's return types are precise.

``tests/test_typing.py`` type-checks this file as a user project would (the
installed ``optiplug``, no repository configuration). It is not a test module
(pytest does not collect it) and is never run; only its types matter.
"""

from __future__ import annotations

import sys

import torch

import optiplug
from optiplug import checkpoint

if sys.version_info >= (3, 11):
    from typing import assert_type
else:  # the repository's mypy configuration targets 3.10; torch requires typing_extensions
    from typing_extensions import assert_type

model = torch.nn.Linear(4, 2)
params = list(model.parameters())

# optiplug.create returns a torch optimizer, not Any.
optimizer = optiplug.create("adamw", params, lr=3e-4)
assert_type(optimizer, torch.optim.Optimizer)
assert_type(optiplug.create("sgd", model.named_parameters(), impl="loop"), torch.optim.Optimizer)
optimizer.zero_grad()
optimizer.step()

# So does a registry of one's own.
registry = optiplug.Registry(autoload=False)
assert_type(registry.create("adamw", params), torch.optim.Optimizer)
assert_type(registry.factory("adamw"), optiplug.OptimizerFactory)

# Factories are OptimizerFactory.
recipe = optiplug.factory("adamw", lr=1e-3, weight_decay=0.1)
assert_type(recipe, optiplug.OptimizerFactory)
assert_type(recipe.name, str)
assert_type(recipe(params), torch.optim.Optimizer)
assert_type(optiplug.AutoOptimizer.for_task("text-generation")(params), torch.optim.Optimizer)

# Schedules are Schedule: calling one gives a float multiplier.
cosine = optiplug.schedule("cosine", total_steps=1000, warmup_steps=50)
assert_type(cosine, optiplug.Schedule)
assert_type(cosine(10), float)

# Records and queries.
assert_type(optiplug.spec("adamw"), optiplug.OptimizerSpec)
assert_type(optiplug.optimizers(), list[str])
assert_type(optiplug.plugins(), list[optiplug.PluginInfo])
assert_type(optiplug.validate_state_dict(optimizer, optimizer.state_dict()), list[optiplug.Problem])
assert_type(optiplug.AutoOptimizer.for_task("text-generation"), optiplug.Selection)

# Names imported on first access at run time are typed all the same.
assert_type(optiplug.Graph(model), optiplug.Graph)
assert_type(checkpoint.verify("ckpt"), checkpoint.CheckpointInfo)
