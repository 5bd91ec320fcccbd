"""Whether the ``triton`` implementations can run here, and on which tensors.

Nothing here imports triton, and torch only inside the functions: the
registry calls :func:`unavailable_reason` for ``optiplug list``, which must
stay cheap, so it asks the CUDA driver directly unless torch is imported.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "INTERPRET_VARIABLE",
    "cuda_available",
    "interpreter_requested",
    "triton_installed",
    "triton_supported",
    "unavailable_reason",
]

INTERPRET_VARIABLE = "TRITON_INTERPRET"
"""With this environment variable set to ``"1"``, triton runs kernels in its
CPU interpreter; the ``triton`` implementations then also accept CPU tensors."""

_NO_TRITON = "triton is not installed"
_NO_CUDA = "needs a CUDA device"


def interpreter_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` is ``"1"`` (read on every call).

    Returns:
        True when triton's CPU interpreter is requested.
    """
    return os.environ.get(INTERPRET_VARIABLE) == "1"


def triton_installed() -> bool:
    """Whether the ``triton`` package can be found (without importing it).

    Returns:
        True when ``import triton`` would find a package.
    """
    if "triton" in sys.modules:
        return sys.modules["triton"] is not None
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def unavailable_reason() -> str | None:
    """Why the ``triton`` implementations cannot run on this machine, or None.

    Returns:
        ``"triton is not installed"`` when triton cannot be found,
        ``"needs a CUDA device"`` when there is no CUDA device and
        ``TRITON_INTERPRET`` is not ``"1"``, else None.
    """
    if not triton_installed():
        return _NO_TRITON
    if interpreter_requested():
        return None
    return None if cuda_available() else _NO_CUDA


_DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


def cuda_available() -> bool:
    """Whether a CUDA device can be used, without importing torch.

    With torch imported this is ``torch.cuda.is_available()``; otherwise the
    CUDA driver is asked for its device count (which honours
    ``CUDA_VISIBLE_DEVICES``), as torch itself does.

    Returns:
        True when at least one CUDA device is visible.
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        return bool(torch.cuda.is_available())
    return _driver_device_count() > 0


def _driver_device_count() -> int:
    """The number of devices the CUDA driver library reports; 0 without a driver."""
    for name in _DRIVER_LIBRARIES:
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


_DTYPE_NAMES = ("float32", "bfloat16", "float16")


def _is_dtensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a distributed tensor (its local shard is not the whole value)."""
    import torch  # deferred: imports torch

    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor  # deferred: imports torch

    return isinstance(tensor, DTensor)


def _dense(tensor: torch.Tensor) -> bool:
    """Strided, and its elements fill its memory exactly once (any dimension order)."""
    import torch  # deferred: imports torch

    if tensor.layout is not torch.strided:
        return False
    if tensor.is_contiguous():
        return True
    dims = sorted(
        (stride, size) for stride, size in zip(tensor.stride(), tensor.shape, strict=True)
    )
    expected = 1
    for stride, size in dims:
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def triton_supported(params: Sequence[torch.Tensor]) -> bool:
    """Whether the ``triton`` implementations can run ``params``.

    True when triton can be found and every tensor is a dense strided
    float32, bfloat16 or float16 tensor (not a ``DTensor``) on a CUDA device,
    or on the CPU while ``TRITON_INTERPRET=1``.

    Args:
        params: the parameter tensors.

    Returns:
        Whether every tensor qualifies.
    """
    if not triton_installed():
        return False
    interpret = interpreter_requested()
    for param in params:
        device = param.device.type
        if device != "cuda" and not (device == "cpu" and interpret):
            return False
        if str(param.dtype).removeprefix("torch.") not in _DTYPE_NAMES:
            return False
        if param.is_complex() or _is_dtensor(param) or not _dense(param):
            return False
    return True
