"""The toolkit for plugin authors: everything a first-party plugin builds on.

A package of small modules by concern, all re-exported here: the contract
(``_contract``), construction (``_construction``), the torch-backed wrapper
(``_torch_backed``), the external wrapper (``_external``), the kernel table
(``_kernel_table``), the step pipeline (``_pipeline``) and the call helpers
(``_calls``); param groups and the train/eval lifecycle come from the core.

Plugins (first-party or not) import only public modules: :mod:`optiplug`,
:mod:`optiplug.base`, :mod:`optiplug.validators`, :mod:`optiplug.errors`
and :mod:`optiplug.testing`. This one holds the pieces that import torch:

* :class:`TorchBackedOptimizer` and :func:`torch_backed_optimizer`: torch's
  own optimizer class (fused/foreach Adam, AdamW, SGD) with validated
  hyperparameters, a measured choice of ``impl`` and validated state loading::

      class Adam(TorchBackedOptimizer, torch.optim.Adam):
          algorithm = "adam"
          config_class = AdamConfig

* :class:`KernelTableOptimizer`: an optimizer of one's own with several
  implementations (kernels) sharing one state layout, as torch's ``adamw()``
  dispatches to its single-tensor, multi-tensor and fused kernels.
* :func:`choose_implementation`: the measured choice among implementation
  records that :func:`optiplug.create` makes.
* :func:`prepare`, :class:`Prepared` and :func:`accepts_prepared`: the one
  construction sequence (validate, group, choose, once) and its finished
  decision, which :func:`optiplug.create` hands to a class whose
  ``__init__`` accepts it, so that it neither validates nor chooses again.
* The step pipeline (:func:`run_pipeline`): small pieces a class declares
  in ``step_pipeline`` and runs around its kernel, :data:`cautious_decay`
  (the weight-decay rule) and :data:`state_codec` (the state precision and
  its C step), composed as data, never by changing ``param_groups``.
* :func:`validated_config`, :func:`named_param_groups`,
  :func:`parameter_tensors`, :func:`group_overrides`: the ``params`` and
  hyperparameter handling every optimizer repeats.
* :func:`build_c_library` (:class:`NativeLibrary`): a small C kernel built
  with the system's C compiler (0.1-5 s, see :mod:`optiplug._native`) and
  kept per machine, for a CPU kernel that should not wait for
  ``torch.compile``; ``c_library_or_none(source, name, wait=False)`` builds
  it in a background thread so a training step never waits.
* :func:`warn_at_caller` / :func:`caller_stacklevel`: warnings that point at
  the user's line, not at optiplug or torch.

Plugin entry-point modules must not import torch (``optiplug list`` imports
them): name optimizer classes with :func:`optiplug.lazy` there.
"""

from __future__ import annotations

from .._compat import publish
from .._core.decision import Prepared, accepts_prepared
from .._core.groups import count_layers, param_groups, param_groups_report
from .._core.implementations import foreach_supported, fused_supported
from .._core.lifecycle import set_training, training_step
from .._core.params import (
    GROUP_META_KEYS,
    NamedParamGroup,
    group_overrides,
    named_param_groups,
    parameter_tensors,
)
from .._native import NativeLibrary, build_c_library
from .._state.codec import (
    LOW_RANK,
    QuantizedState,
    convert_state,
    group_precision,
    step_in_state_precision,
)
from .._state.native_blocks import (
    CODEC_C_SOURCE,
    c_library_or_none,
    c_step_applies,
    codec_tables,
    seed_term,
)
from .._state.native_state import (
    StateKernel,
    StateKernelSource,
    build_state_kernel,
    state_kernel_or_none,
)
from ._calls import caller_stacklevel, closure_loss, warn_at_caller
from ._construction import (
    choose_implementation,
    excluded_implementations,
    prepare,
    validated_config,
)
from ._contract import ContractOptimizer, Kernel, Supports, ValidatedLoading
from ._external import ClosureStep, ExternalOptimizer, external_implementations, external_optimizer
from ._kernel_table import KernelTableOptimizer
from ._pipeline import (
    StepPiece,
    cautious_decay,
    cautious_weight_decay,
    run_pipeline,
    state_codec,
    stepping_view,
)
from ._torch_backed import TorchBackedOptimizer, torch_backed_optimizer

__all__ = [
    "CODEC_C_SOURCE",
    "c_library_or_none",
    "c_step_applies",
    "codec_tables",
    "group_precision",
    "seed_term",
    "state_kernel_or_none",
    "GROUP_META_KEYS",
    "LOW_RANK",
    "ClosureStep",
    "ContractOptimizer",
    "ExternalOptimizer",
    "Kernel",
    "KernelTableOptimizer",
    "NamedParamGroup",
    "NativeLibrary",
    "Prepared",
    "QuantizedState",
    "StateKernel",
    "StateKernelSource",
    "StepPiece",
    "Supports",
    "TorchBackedOptimizer",
    "ValidatedLoading",
    "accepts_prepared",
    "build_c_library",
    "build_state_kernel",
    "caller_stacklevel",
    "cautious_decay",
    "cautious_weight_decay",
    "choose_implementation",
    "closure_loss",
    "convert_state",
    "count_layers",
    "excluded_implementations",
    "external_implementations",
    "external_optimizer",
    "foreach_supported",
    "fused_supported",
    "group_overrides",
    "named_param_groups",
    "param_groups",
    "param_groups_report",
    "parameter_tensors",
    "prepare",
    "run_pipeline",
    "set_training",
    "state_codec",
    "step_in_state_precision",
    "stepping_view",
    "torch_backed_optimizer",
    "training_step",
    "validated_config",
    "warn_at_caller",
]


publish(__name__, globals(), __all__)
