"""heavyball's optimizer classes with optiplug's contract (imports torch and heavyball).

Each class here is the heavyball class of the same name, built with
:func:`optiplug.base.external_optimizer` (validated keywords, honest
``impl``, validated all-or-nothing loading) plus :class:`HeavyBallOptimizer`,
which adapts heavyball's state dict to optiplug's checkpoint format
(:mod:`optiplug_heavyball.state`) and keeps heavyball's own defaults for the
keywords the user leaves at :data:`~optiplug_heavyball.catalog.LIBRARY_DEFAULT`.

heavyball compiles its kernels with ``torch.compile`` by default; set
``heavyball.utils.compile_mode = None`` before the first step to run them
eagerly (what the CPU tests do).
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any

import heavyball  # type: ignore[import-untyped]
import torch
from torch._inductor import config as inductor_config

from optiplug.base import (
    ExternalOptimizer,
    Prepared,
    accepts_prepared,
    external_optimizer,
    parameter_tensors,
)

from . import state as _state
from .catalog import CATALOG, LIBRARY_DEFAULT, Entry
from .config import CONFIGS

__all__ = ["CLASSES", "HeavyBallOptimizer"]


class HeavyBallOptimizer(ExternalOptimizer):
    """Mixin: heavyball's state dict in optiplug's flat form, heavyball's defaults kept.

    ``state_dict()`` returns the flat form of :mod:`optiplug_heavyball.state`;
    ``load_state_dict`` (optiplug's validated loading) accepts it or
    heavyball's own form, and puts the state back in heavyball's layout.
    Copies (``copy.deepcopy``, pickle) are rebuilt by the constructor and
    can step.
    """

    _bridge_keywords: dict[str, Any]

    @accepts_prepared
    def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(params, *args, **kwargs)
        self.register_load_state_dict_pre_hook(_state.to_flat)
        self.register_load_state_dict_post_hook(_restore, prepend=True)

    def _keywords(self, made: Prepared) -> dict[str, Any]:
        """The validated keywords, less those left to heavyball's own default."""
        keywords = super()._keywords(made)
        self._bridge_keywords = {k: v for k, v in keywords.items() if not _is_library_default(v)}
        return dict(self._bridge_keywords)

    def _step(self, group: dict[str, Any]) -> None:
        """heavyball's update of one group, on generators seeded by the group's step counter.

        heavyball draws random numbers from torch's global generators (PSGD's
        probe vectors, PSGD-LRA's initial factors, the random start of the
        orthogonalisation in Muon and Scion), so a resumed run is bit-equal
        only if those generators' states were saved with the optimizer. Here
        each group's update runs inside :func:`torch.random.fork_rng` on the
        CPU generator (and those of the CUDA devices holding its parameters)
        seeded by the group's own update counter (group key
        :data:`~optiplug_heavyball.state.RNG_STEP`, saved in the state dict):
        the update is a function of the optimizer state alone, resume is
        bit-equal through any checkpoint, and the caller's generators (dropout
        in the closure, data order) are left as they were.
        """
        count = int(group.get(_state.RNG_STEP, 0))
        index = next(i for i, g in enumerate(self.param_groups) if g is group)
        devices = sorted({p.device.index or 0 for p in group["params"] if p.device.type == "cuda"})
        seed = _SEED + _GROUP_STRIDE * index + count
        with torch.random.fork_rng(devices=devices), _compile_settings(group):
            torch.default_generator.manual_seed(seed)
            for device in devices:
                torch.cuda.default_generators[device].manual_seed(seed)
            super()._step(group)  # type: ignore[misc]
        group[_state.RNG_STEP] = count + 1

    def state_dict(self) -> dict[str, Any]:
        """The state dict in the flat form (see :mod:`optiplug_heavyball.state`)."""
        return _state.flat_state_dict(super().state_dict())

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Copies (``copy.deepcopy``, pickle) are rebuilt by the constructor, then given the state.

        torch's ``Optimizer.__getstate__`` keeps only the state and groups,
        which leaves a heavyball copy without its transform chain, and the
        chain itself does not pickle (its functions are wrapped by
        decorators); the constructor rebuilds it from the same keywords.
        """
        del protocol
        running = {
            key: vars(self)[key]
            for key in ("inner_group", "_fallback_enabled")
            if key in vars(self)
        }
        arguments = (type(self), self._bridge_keywords, self.param_groups, self.state, running)
        return (_rebuilt, arguments)

    def __deepcopy__(self, memo: dict[int, Any]) -> HeavyBallOptimizer:
        """A copy rebuilt by the constructor (see :meth:`__reduce_ex__`), its state deep-copied."""
        rebuild, arguments = self.__reduce_ex__(4)
        clone: HeavyBallOptimizer = rebuild(*copy.deepcopy(arguments, memo))
        memo[id(self)] = clone
        return clone


class _LowRankPSGD(HeavyBallOptimizer):
    """PSGD-LRA: ``rank=None`` resolved here, with heavyball's formula, from the tensors.

    heavyball's ``PSGDLRA`` computes its default rank, ``round(log2(number
    of parameter elements))`` (at least 1), by calling ``numel()`` on each
    item of ``params``, which fails on ``(name, tensor)`` pairs and param-group
    dicts (both of which it otherwise accepts); the bridge computes the same
    number from the parameter tensors and passes it.
    """

    def _keywords(self, made: Prepared) -> dict[str, Any]:
        keywords = super()._keywords(made)
        if keywords.get("rank") is None:
            count = sum(p.numel() for p in parameter_tensors(made.params))
            keywords["rank"] = max(1, round(math.log2(max(count, 1))))
            self._bridge_keywords["rank"] = keywords["rank"]
        return keywords


def _compile_settings(group: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
    """Inductor's settings for compiling a group's kernels: no C++ GEMM template on CPU.

    heavyball compiles with ``mode="max-autotune-no-cudagraphs"``; on CPU,
    Inductor's autotuning then offers its C++ batched-GEMM template, and for
    the SOAP family's preconditioner product (``kl_soap`` on a 64x96 matrix:
    ``bmm(1x96x64, 1x64x96)`` with a fused epilogue) rendering that template's
    epilogue fails an indexing assertion (an index and a stride of different
    rank), an ``InductorError`` at the first step that compiles it. Offering
    only ATen's kernels to the GEMM autotuning (``max_autotune_gemm_backends``)
    compiles it, and every other fusion of the mode is kept. Nothing changes
    when heavyball runs eagerly (``compile_mode = None``) or on CUDA.
    """
    on_cpu = all(p.device.type == "cpu" for p in group["params"])
    if not on_cpu or heavyball.utils.compile_mode is None:
        return contextlib.nullcontext()
    patched: contextlib.AbstractContextManager[Any] = inductor_config.patch(
        max_autotune_gemm_backends="ATEN"
    )
    return patched


def _rebuilt(
    cls: type[HeavyBallOptimizer],
    keywords: dict[str, Any],
    groups: list[dict[str, Any]],
    state: dict[Any, Any],
    running: dict[str, Any],
) -> HeavyBallOptimizer:
    """A copy: ``cls`` built with ``keywords`` over ``groups``' parameters, then their state."""
    optimizer = cls([{"params": group["params"]} for group in groups], **keywords)
    optimizer.param_groups = [dict(group) for group in groups]
    optimizer.state.update(state)
    optimizer.__dict__.update(running)
    return optimizer


_SEED = 0x5EED
_GROUP_STRIDE = 1 << 32


def _is_library_default(value: Any) -> bool:
    return isinstance(value, str) and value == LIBRARY_DEFAULT


def _restore(optimizer: Any) -> None:
    """Load post-hook: loaded flat entries back to heavyball's nested layout, running state too."""
    for param, entry in list(optimizer.state.items()):
        if entry and _state.is_flat_entry(entry):
            optimizer.state[param] = _state.nest_entry(entry)
    _state.first_parameter_step(optimizer.state, optimizer.param_groups)
    inner: dict[str, Any] = {}
    fallback = False
    for index, group in enumerate(optimizer.param_groups):
        for key in [k for k in group if k.startswith(_state.INNER_PREFIX)]:
            value = group.pop(key)
            if index == 0:
                inner[key.removeprefix(_state.INNER_PREFIX)] = value
        fallback = bool(group.pop(_state.FALLBACK_KEY, False)) if index == 0 else fallback
        group.pop(_state.FALLBACK_KEY, None)
    optimizer.inner_group = inner  # the saved optimizer's, whole: not merged with this one's
    optimizer._fallback_enabled = fallback


def _bridge(entry: Entry) -> type[HeavyBallOptimizer]:
    """The optiplug class of one catalogue row."""
    name = entry.target.split(":")[1]
    library_class = getattr(heavyball, name)
    base = external_optimizer(
        entry.name,
        library_class,
        CONFIGS[entry.name],
        group_state=_state.GROUP_STATE,
        name=name,
        module=__name__,
    )
    namespace = {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"heavyball's {name} with optiplug's contract ({entry.summary}).",
        "__signature__": base.__signature__,  # type: ignore[attr-defined]
    }
    mixin = _LowRankPSGD if library_class is heavyball.PSGDLRA else HeavyBallOptimizer
    return type(name, (mixin, base), namespace)


CLASSES: dict[str, type[HeavyBallOptimizer]] = {entry.name: _bridge(entry) for entry in CATALOG}
"""Registered name -> class."""

globals().update({cls.__name__: cls for cls in CLASSES.values()})
