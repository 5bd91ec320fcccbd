"""optiplug-sgd: stochastic gradient descent (with momentum and Nesterov) for optiplug.

``SGD`` is ``torch.optim.SGD`` with validated hyperparameters and a measured
choice of implementation; import it from here or create it by name with
``optiplug.create("sgd", params)``. Importing this package does not import
torch: ``SGD`` is built on first access.
"""

from __future__ import annotations

from typing import Any

from .plugin import SGD_STATE, SGDConfig

__all__ = ["SGD", "SGD_STATE", "SGDConfig"]

_DOC = """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

Same update and state names (``momentum_buffer``) as ``torch.optim.SGD``.

Args:
    params: tensors, param-group dicts or ``(name, tensor)`` pairs.
    lr: learning rate (default 1e-3).
    impl: ``"loop"``, ``"foreach"``, ``"fused"`` or None (fastest, measured).
    **hparams: ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``,
        ``maximize`` (see :class:`~optiplug_sgd.SGDConfig`).
"""


def __getattr__(name: str) -> Any:
    if name != "SGD":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import torch  # deferred: imports torch

    from optiplug.base import fused_sgd_step, torch_backed_optimizer  # deferred: imports torch

    built = torch_backed_optimizer(
        "sgd", torch.optim.SGD, SGDConfig, module=__name__, doc=_DOC, state_step=fused_sgd_step
    )
    return globals().setdefault(name, built)  # one class object, so instances pickle
