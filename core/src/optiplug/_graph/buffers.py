"""A Graph's module buffers: put back after a failed step, checked before a save or load.

A training forward pass changes some buffers before the loss is known
(BatchNorm's running statistics, ``num_batches_tracked``). When the step of
that forward then fails or is skipped for a non-finite loss or gradient,
"nothing was applied" must hold for those buffers too, so a Graph keeps a
copy of its module's persistent buffers (those in its state dict, the ones a
checkpoint holds) as they were after the last optimizer step and copies
them back. Some buffers hold inf by construction (a causal mask of ``-inf``):
the buffers already non-finite when the Graph got the module may stay so;
any other that holds NaN or inf was made so by training and is refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from .finite import all_finite, first_nonfinite

__all__ = ["BufferKeeper", "persistent_buffers"]


def persistent_buffers(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(state-dict name, buffer)`` for every buffer ``module.state_dict()`` holds."""
    for name, buffer in module.named_buffers():
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        if leaf not in owner._non_persistent_buffers_set:
            yield name, buffer


class BufferKeeper:
    """The persistent buffers of a module as of the last optimizer step, and which may be non-finite.

    Args:
        module: the module whose buffers to keep (the unwrapped one).
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module
        self._kept: dict[str, torch.Tensor] = {}
        self.nonfinite_from_start = frozenset(
            name for name, buffer in persistent_buffers(module) if not all_finite([buffer])
        )
        self.keep()

    def keep(self) -> None:
        """Copy the buffers as they are now (after a step, a load): what :meth:`restore` puts back."""
        current = dict(persistent_buffers(self._module))
        with torch.no_grad():
            for name, buffer in current.items():
                held = self._kept.get(name)
                if held is not None and _same_layout(held, buffer):
                    held.copy_(buffer)
                else:
                    self._kept[name] = buffer.detach().clone()
        for name in self._kept.keys() - current.keys():
            del self._kept[name]

    def restore(self) -> None:
        """Copy the kept values back into the buffers (a failed or skipped step's forwards undone)."""
        with torch.no_grad():
            for name, buffer in persistent_buffers(self._module):
                held = self._kept.get(name)
                if held is None:
                    continue
                if held.shape == buffer.shape and held.dtype == buffer.dtype:
                    buffer.copy_(held)
                else:  # the forward replaced the buffer: put a copy of the kept one back
                    owner_name, _, leaf = name.rpartition(".")
                    setattr(self._module.get_submodule(owner_name), leaf, held.to(buffer.device))

    def first_made_nonfinite(self) -> str | None:
        """``"buffer 'name'"`` of the first buffer training made non-finite, or None."""
        return first_nonfinite(
            (f"buffer {name!r}", buffer)
            for name, buffer in persistent_buffers(self._module)
            if name not in self.nonfinite_from_start
        )

    def made_nonfinite(self, state: Mapping[str, torch.Tensor]) -> list[str]:
        """The names in a saved model ``state`` holding NaN or inf that may not.

        Parameters never may; a buffer may when it held NaN or inf when this
        Graph got the module (a mask built with ``-inf``).
        """
        checked = {k: v for k, v in state.items() if k not in self.nonfinite_from_start}
        if all_finite(checked.values()):  # one reduction; names only when something is not
            return []
        return [name for name, value in checked.items() if not all_finite([value])]


def _same_layout(one: torch.Tensor, other: torch.Tensor) -> bool:
    return one.shape == other.shape and one.dtype == other.dtype and one.device == other.device
