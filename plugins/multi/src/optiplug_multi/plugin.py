"""Entry-point module of optiplug-multi: hookimpls only, no torch import."""

from __future__ import annotations

import optiplug

OPTIPLUG_API = 1


@optiplug.hookimpl
def optiplug_optimizers() -> list[optiplug.OptimizerSpec]:
    """Provide ``multi``."""
    return [
        optiplug.OptimizerSpec(
            name="multi",
            factory=optiplug.lazy("optiplug_multi.optimizer:MultiOptimizer"),
            description=(
                "Several registered algorithms over disjoint parameter sets, as one optimizer "
                "with one state dict; routes match parameters by glob, predicate or list, "
                "first match wins."
            ),
            example_hparams={"routes": [{"algorithm": "sgd", "match": "*", "lr": 0.05}]},
            # "uses-registry": create() passes registry=, so routes resolve where multi did;
            # "uses-model": create(multi, module) passes model=; "own-param-groups":
            # no_decay/layer_decay come to multi, which applies them per route
            capabilities={"composite", "uses-registry", "uses-model", "own-param-groups"},
        )
    ]
