"""Entry-point module of optiplug-fused: implementation records only (imports neither torch nor triton).

It adds an implementation named ``triton`` to ``adamw``, ``adam``, ``sgd``
and ``lion``: multi-tensor Triton kernels (one launch per param group,
device and dtype) that keep each algorithm's state layout.
"""

from __future__ import annotations

import optiplug

__all__ = ["IMPLEMENTATIONS", "OPTIPLUG_API", "fused_implementations", "optiplug_implementations"]

OPTIPLUG_API = 1

PRIORITY = 3
"""Above every torch-backed and first-party implementation (fused is 2): on a
CUDA machine, without measuring, the triton kernels are preferred."""

IMPLEMENTATIONS: dict[str, tuple[str, str]] = {
    "adamw": (
        "TritonAdamW",
        "Triton multi-tensor AdamW: one launch per group/device/dtype, fp32 state, "
        "device lr/step, GradScaler, optional bf16 stochastic rounding",
    ),
    "adam": (
        "TritonAdam",
        "Triton multi-tensor Adam: one launch per group/device/dtype, fp32 state, "
        "device lr/step, GradScaler, optional bf16 stochastic rounding",
    ),
    "sgd": (
        "TritonSGD",
        "Triton multi-tensor SGD (momentum, Nesterov): one launch per group/device/dtype, "
        "fp32 state, GradScaler, optional bf16 stochastic rounding",
    ),
    "lion": (
        "TritonLion",
        "Triton multi-tensor Lion: one launch per group/device/dtype, fp32 state, "
        "GradScaler, optional bf16 stochastic rounding",
    ),
}
"""algorithm -> (class in :mod:`optiplug_fused.optimizers`, description)."""


def fused_implementations() -> list[optiplug.ImplementationSpec]:
    """The ``triton`` records of the four algorithms.

    Returns:
        One :class:`optiplug.ImplementationSpec` per algorithm, with lazy
        factory, ``supports`` and ``availability`` references.
    """
    return [
        optiplug.ImplementationSpec(
            algorithm,
            "triton",
            optiplug.lazy(f"optiplug_fused.optimizers:{class_name}"),
            supports=optiplug.lazy("optiplug_fused.availability:triton_supported"),
            availability=optiplug.lazy("optiplug_fused.availability:unavailable_reason"),
            priority=PRIORITY,
            description=description,
            compiles=True,
        )
        for algorithm, (class_name, description) in IMPLEMENTATIONS.items()
    ]


@optiplug.hookimpl
def optiplug_implementations() -> list[optiplug.ImplementationSpec]:
    """Provide the ``triton`` implementation of ``adamw``, ``adam``, ``sgd`` and ``lion``."""
    return fused_implementations()
