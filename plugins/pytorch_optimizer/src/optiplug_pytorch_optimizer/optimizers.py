"""The wrapper classes: each library class with optiplug's contract (imports torch).

``optimizers.Adan`` is ``pytorch_optimizer.Adan`` built through
:func:`optiplug.base.external_optimizer`: validated keywords (the
catalogue's schema), only the keywords the class names passed on, an honest
``impl`` and validated, all-or-nothing state loading. Classes are built on
first access and cached, so they pickle by reference.

The adaptations, each for a way the library departs from
``torch.optim.Optimizer``'s conventions (listed in the bridge's docs):

* a step when no parameter has a gradient does nothing, as torch's
  optimizers do (some classes raise ``ZeroParameterSizeError`` there);
* param-group keys the class keeps as 1-element tensors (D-Adaptation's
  ``d``, Prodigy's ``d_numerator``...) are saved as 0-d tensors, which
  optiplug's group-state checks accept, and reshaped back when loaded;
  group values that are a ``torch.dtype`` (ROSE's ``compute_dtype``)
  or a dict (SCION's ``norm_kwargs``) are saved as flat tuples
  (``("torch.dtype", "float64")``, ``("dict", key, value, ...)``) and
  decoded when loaded;
* state the class keeps in ``optimizer.state`` under a key that is no
  parameter (MADGRAD's step count ``k``, EmoNavi's loss averages ``ema``,
  SPAM's step counters ``total_step`` and ``current_step``) is saved in the
  first param group as ``global:<key>`` (a running group key) and put back
  when loaded;
* running state the class keeps as attributes of the optimizer (Ranger21's
  lookahead counter and learning rates, StableSPAM's step count, the SPAM
  family's cosine warmup, whose state dict is nested) is saved in the first
  param group as ``attr:<name>`` (a plain value, or a nested state dict
  flattened into a tuple ``("tree", ...)``) and put back when loaded; the
  top-level keys the class's own ``state_dict()`` adds for them are left out;
* per-parameter state held in nested containers (AggMo's dict of momentum
  buffers, AdaShift's deque of past gradients, DASH's list of block dicts)
  is kept between steps as the list of its tensors under the slot's name
  and its structure as a tuple of plain values under ``<slot>:layout``,
  which checkpoints store and the memory report counts; the step rebuilds
  the containers and packs them again after the update;
* per-parameter state that is a non-contiguous view is packed as a
  contiguous copy, the layout a checkpoint gives back, so a resumed run
  multiplies the same memory layouts, bit for bit;
* a step that draws random numbers (Kron, AdaHessian, SophiaH, SPAM) runs
  on torch's and NumPy's global generators seeded from the wrapper's own
  stream (a seed drawn at construction plus the step count, both saved as
  ``attr:`` keys), and their states are put back afterwards: a resumed run
  draws the same numbers and the caller's stream is untouched;
* a copy (``copy.deepcopy``, ``pickle``) keeps the attributes the class
  set in its constructor (torch's ``Optimizer.__getstate__`` keeps only
  ``defaults``, ``state`` and ``param_groups``, so a copy of a class that
  reads its settings from attributes, FlashAdamW's ``compress_state_dict``
  or Ranger21's ``lookahead_step``, failed or lost them); an attribute
  holding one of the constructor's default functions (ADOPT's lambda
  ``clip_lambda``) is pickled as a reference to that default;
* a closure runs with gradients enabled, as torch's L-BFGS runs it (AliG
  calls it inside its own ``no_grad`` step);
* a class that takes a model (AdamMini, which partitions by parameter
  name; LOMO and AdaLOMO, which hook the model's parameters) is given a
  :class:`ParameterModule` holding exactly the given parameters under their
  names;
* per-parameter state a class keeps in dicts keyed by parameter name
  (AdaLOMO's ``exp_avg_sq``, ``exp_avg_sq_row`` and ``exp_avg_sq_col``) is
  kept in ``optimizer.state[param]`` under the dict's name too (the same
  tensors, so checkpoints store it and the memory report counts it); the
  class's own top-level copies of the dicts are left out of the state dict,
  and loading points the dicts at the loaded tensors;
* a class that updates inside the backward pass (LOMO, AdaLOMO) is driven by
  its ``fused_backward(loss, lr)`` as upstream, and also by a plain
  ``loss.backward()`` then ``step()`` (see :class:`FusedBackwardOptimizer`);
* the Muon family requires a ``use_muon`` key in every group: groups
  without one are split, matrices (2-D and up) on Muon and the rest on the
  class's AdamW, the rule the library's ``prepare_muon_parameters`` applies;
  every group also gets ``use_adamw`` (``not use_muon``, which the library
  ignores), so the state schema can say which slots each group keeps.

A loaded optimizer is restored (every saved form above put back) as it is
loaded, by ``__setstate__``, which both optiplug's and torch's loaders call.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, NamedTuple

import attrs
import numpy
import torch
from pytorch_optimizer.optimizer import lomo
from pytorch_optimizer.optimizer.utils import galore, graft, partition, preconditioner

from optiplug.base import ExternalOptimizer, Prepared, accepts_prepared, external_optimizer
from optiplug.errors import HyperparameterError

from .catalog import ENTRIES
from .plugin import PLUGIN, class_name
from .schema import config_class
from .table import REQUIRED, Entry, LibraryDefault

__all__ = [
    "BridgedOptimizer",
    "FusedBackwardOptimizer",
    "ParameterModule",
    "module_of",
    "pack_value",
    "unpack_value",
    "wrapper",
]

_ENTRIES: dict[str, Entry] = {class_name(entry): entry for entry in ENTRIES}
_BUILT: dict[str, type[ExternalOptimizer]] = {}


class BridgedOptimizer(ExternalOptimizer):
    """A pytorch-optimizer class with optiplug's contract (see the module docstring).

    Keywords whose default is the library's own (a dtype, a function: no
    literal in the catalogue) are passed only when given; a keyword the
    class requires (``num_iterations`` of Ranger21) must be given.
    """

    catalog_entry: ClassVar[Entry]

    @accepts_prepared
    def __init__(self, params: Iterable[Any] | Prepared, *args: Any, **kwargs: Any) -> None:
        if self.catalog_entry.muon_groups:
            params = _with_use_muon(params)
        super().__init__(params, *args, **kwargs)
        self.register_load_state_dict_pre_hook(_decoded_groups)
        self._expose_named_state()
        if self.catalog_entry.own_rng:
            self.bridge_rng_seed = int(torch.randint(0, _SEEDS, ()).item())
            self.bridge_rng_step = 0

    def _keywords(self, made: Prepared) -> dict[str, Any]:
        """The validated keywords to pass the class: given, or with a literal default.

        Raises:
            HyperparameterError: a keyword the class requires was not given.
        """
        keywords = super()._keywords(made)
        for name, value in keywords.items():
            if value is REQUIRED:
                raise HyperparameterError(
                    name,
                    None,
                    f"is required by {self.catalog_entry.name}",
                    algorithm=self.algorithm,
                )
        return {k: v for k, v in keywords.items() if not isinstance(v, LibraryDefault)}

    def state_dict(self) -> dict[str, Any]:
        """The class's state dict in the form optiplug stores (see the module docstring)."""
        state = super().state_dict()
        groups = state["param_groups"]
        shapes = dict(self.catalog_entry.group_tensors)
        for group in groups:
            for key, value in list(group.items()):
                if key in shapes and isinstance(value, torch.Tensor) and value.numel() == 1:
                    group[key] = value.reshape(())
                elif isinstance(value, (torch.dtype, dict)):
                    group[key] = _encoded(value)
        for key, kind, _ in self.catalog_entry.global_state:
            if key in state["state"] and groups:
                groups[0][f"global:{key}"] = _stored(kind, state["state"].pop(key))
        for name in self.catalog_entry.named_state:
            state.pop(name, None)  # the class's own top-level copy: in the per-parameter state
        for name, kind in self.catalog_entry.attributes:
            state.pop(name, None)  # the class's own top-level copy: carried in the group instead
            if groups:
                groups[0][f"attr:{name}"] = _stored_attribute(kind, getattr(self, name))
        return state

    def __getstate__(self) -> dict[str, Any]:
        """Torch's state plus every attribute the class set (its settings and counters).

        An attribute holding one of the constructor's own default functions
        (ADOPT's ``clip_lambda``, a lambda, which cannot be pickled) is
        saved as a reference to that default.
        """
        state = super().__getstate__()
        defaults = _function_defaults(self.external_class)
        own = {
            key: _DefaultFunction(defaults[id(value)][1]) if id(value) in defaults else value
            for key, value in self.__dict__.items()
            if key not in _TORCH_ATTRIBUTES and not key.startswith("_optiplug") and key not in state
        }
        return {**own, **state}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Torch's ``__setstate__``, then the saved forms put back (a load calls it too)."""
        functions = _function_defaults(self.external_class)
        by_keyword = {keyword: function for function, keyword in functions.values()}
        state = {
            key: by_keyword[value.keyword] if isinstance(value, _DefaultFunction) else value
            for key, value in state.items()
        }
        super().__setstate__(state)
        if "param_groups" in self.__dict__:
            self._restore()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """The class's step; nothing when no parameter has a gradient and there is no closure.

        A closure runs with gradients enabled, as torch's L-BFGS runs it (AliG
        calls it inside its own ``no_grad`` step).
        """
        if closure is None and not any(
            p.grad is not None for group in self.param_groups for p in group["params"]
        ):
            return None
        if closure is not None:
            closure = torch.enable_grad()(closure)
        self._restore()
        self._unpack()
        try:
            if not self.catalog_entry.own_rng:
                return super().step(closure)
            with _seeded(self.bridge_rng_seed + self.bridge_rng_step, self._devices()):
                loss = super().step(closure)
            self.bridge_rng_step += 1
            return loss
        finally:
            self._pack()

    def _devices(self) -> list[int]:
        """The CUDA devices holding parameters (their generators are seeded too)."""
        return sorted(
            {
                p.get_device()
                for group in self.param_groups
                for p in group["params"]
                if p.device.type == "cuda"
            }
        )

    def _restore(self) -> None:
        """Undo :meth:`state_dict`'s storage forms in a loaded optimizer (a no-op otherwise)."""
        shapes = dict(self.catalog_entry.group_tensors)
        for group in self.param_groups:
            for key, value in list(group.items()):
                shape = shapes.get(key)
                if shape is not None and isinstance(value, torch.Tensor):
                    if tuple(value.shape) != shape and value.numel() == math.prod(shape):
                        group[key] = value.reshape(shape)
                elif _is_encoded(value) and not key.startswith(("global:", "attr:")):
                    group[key] = _decoded(value)
        first = self.param_groups[0] if self.param_groups else {}
        state: dict[Any, Any] = self.state  # the library keys its global state by name
        for key, kind, shape in self.catalog_entry.global_state:
            if f"global:{key}" in first:
                stored = first.pop(f"global:{key}")
                state[key] = stored.reshape(shape) if kind == "tensor" else _loaded(kind, stored)
        for name, kind in self.catalog_entry.attributes:
            if f"attr:{name}" in first:
                self._set_attribute(name, kind, first.pop(f"attr:{name}"))
        self._adopt_named_state()

    def _named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """The named parameters of the model a class that takes one holds (none otherwise)."""
        model = self.__dict__.get("model")
        return list(model.named_parameters()) if isinstance(model, torch.nn.Module) else []

    def _expose_named_state(self) -> None:
        """Put the state the class keys by parameter name in ``optimizer.state`` (same tensors)."""
        if not self.catalog_entry.named_state:
            return
        for name, param in self._named_parameters():
            for attribute in self.catalog_entry.named_state:
                tensor = getattr(self, attribute).get(name)
                if tensor is not None:
                    self.state[param][attribute] = tensor

    def _adopt_named_state(self) -> None:
        """Point the class's name-keyed dicts at the tensors ``optimizer.state`` holds (loaded)."""
        if not self.catalog_entry.named_state:
            return
        for name, param in self._named_parameters():
            slots = self.state.get(param, {})
            for attribute in self.catalog_entry.named_state:
                if attribute in slots:
                    getattr(self, attribute)[name] = slots[attribute]

    def _set_attribute(self, name: str, kind: str, stored: Any) -> None:
        """Put back attribute ``name`` from its saved form."""
        if kind == "value":
            setattr(self, name, stored)
        elif stored is not None and getattr(self, name) is not None:
            getattr(self, name).load_state_dict(_decoded(stored))

    def _unpack(self) -> None:
        """Rebuild the packed slots' containers (see the module docstring) for a step."""
        for name in self.catalog_entry.packed:
            for slots in self._param_states():
                layout = slots.pop(f"{name}:layout", None)
                if layout is not None:
                    slots[name] = unpack_value(layout, slots[name])

    def _pack(self) -> None:
        """Store the packed slots as their tensors and a layout tuple, between steps."""
        for name in self.catalog_entry.packed:
            for slots in self._param_states():
                if name in slots and f"{name}:layout" not in slots:
                    slots[name], slots[f"{name}:layout"] = pack_value(slots[name])

    def _param_states(self) -> Iterator[dict[str, Any]]:
        """The state entry of every parameter that has one."""
        for group in self.param_groups:
            for param in group["params"]:
                slots = self.state.get(param)
                if slots:
                    yield slots


class FusedBackwardOptimizer(BridgedOptimizer):
    """LOMO or AdaLOMO: updates inside the backward pass, or by ``backward()`` then ``step()``.

    The library's class hooks the model's parameters so that each is updated
    as its gradient arrives, freeing the gradient at once, while its
    ``fused_backward(loss, lr)`` runs the backward (the usage it documents,
    and what the Hugging Face ``Trainer`` calls for ``optim="lomo"`` and
    ``"adalomo"``). The wrapper keeps that, and:

    * keeps the learning rate in the param groups (the class's ``lr``
      attribute reads and writes them): ``fused_backward(loss, lr)`` writes
      ``lr`` there, ``fused_backward(loss)`` uses theirs (a scheduler's), and
      checkpoints hold it;
    * runs the hooks only inside ``fused_backward`` and ``grad_norm``: a
      plain ``loss.backward()`` leaves the gradients in ``.grad`` (upstream,
      it ran AdaLOMO's update before its first step was counted, which
      divides by a zero second moment), and ``step()`` then applies the
      class's update to them, as in ``fused_backward`` but on unscaled
      gradients, clipped by ``clip_grad_norm`` from their norm; the update
      consumes them (sets ``.grad`` to None), as the class's does;
    * gives a copy (``copy.deepcopy``, ``pickle``) its own hooks on its own
      parameters (the class's update function, a closure over the original,
      is rebuilt on the copy).
    """

    model: torch.nn.Module
    grad_func: Callable[..., Any]

    @accepts_prepared
    def __init__(self, params: Iterable[Any] | Prepared, *args: Any, **kwargs: Any) -> None:
        if issubclass(self.external_class, lomo.AdaLOMO):
            params = _factorable(params, self.algorithm)
        super().__init__(params, *args, **kwargs)

    @property
    def lr(self) -> Any:
        """The learning rate (the first param group's; the class's update reads it)."""
        groups = self.__dict__.get("param_groups")
        return groups[0]["lr"] if groups else self.__dict__.get("_optiplug_lr")

    @lr.setter
    def lr(self, value: Any) -> None:
        groups = self.__dict__.get("param_groups")
        if not groups:  # the class's constructor sets it before making its group
            self.__dict__["_optiplug_lr"] = value
        for group in groups or ():
            group["lr"] = value

    def fuse_update(self) -> Callable[..., Any]:
        """The class's update function, made to run only inside the calls that update."""
        update: Callable[..., Any] = super().fuse_update()  # type: ignore[misc]

        def gated(gradient: Any, *args: Any) -> Any:
            return update(gradient, *args) if self.__dict__.get("_optiplug_fusing") else gradient

        return gated

    @contextlib.contextmanager
    def _fusing(self) -> Iterator[None]:
        """Let the hooks and the update function run for the duration of the block."""
        self.__dict__["_optiplug_fusing"] = True
        try:
            yield
        finally:
            self.__dict__.pop("_optiplug_fusing", None)

    def fused_backward(self, loss: torch.Tensor, lr: Any = None) -> None:
        """Backward through ``loss``, updating each parameter as its gradient arrives.

        Args:
            loss: the loss to differentiate.
            lr: the learning rate of this update, written to the param
                groups; None uses theirs.
        """
        with self._fusing():
            super().fused_backward(loss, self.lr if lr is None else lr)  # type: ignore[misc]

    def grad_norm(self, loss: torch.Tensor) -> None:
        """The class's gradient-norm pass for ``clip_grad_norm``, before ``fused_backward``.

        Args:
            loss: the loss (its graph is kept for ``fused_backward``).
        """
        with self._fusing():
            super().grad_norm(loss)  # type: ignore[misc]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Apply the class's update to the gradients a plain backward left; none: nothing.

        Args:
            closure: re-evaluates the model, calls ``backward`` and returns
                the loss (run with gradients enabled); optional.

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        graded = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        if not graded:
            return loss
        with self._fusing(), self._unscaled():
            if "num_steps" in self.__dict__:  # AdaLOMO's count, which fused_backward advances
                self.__dict__["num_steps"] += 1
            self._clip_coefficient(graded)
            self.grad_func(0)
        return loss

    @contextlib.contextmanager
    def _unscaled(self) -> Iterator[None]:
        """No loss scaling (LOMO's ``loss_scaler``, AdaLOMO's ``loss_scale``) in the block."""
        saved = {key: self.__dict__[key] for key in _LOSS_SCALING if key in self.__dict__}
        self.__dict__.update(dict.fromkeys(saved))
        try:
            yield
        finally:
            self.__dict__.update(saved)

    def _clip_coefficient(self, graded: list[torch.Tensor]) -> None:
        """Set ``clip_coef`` from the gradients' norm, as the class's ``grad_norm`` does."""
        limit = self.__dict__.get("clip_grad_norm")
        if limit is None or limit <= 0:
            return
        grads = [p.grad.to(torch.float32) for p in graded if p.grad is not None]
        norms = torch.stack([torch.norm(grad, 2.0) for grad in grads])
        total = torch.norm(norms, 2.0)
        self.clip_coef = torch.clamp(float(limit) / (total + 1e-6), max=1.0)

    def __getstate__(self) -> dict[str, Any]:
        """As :class:`BridgedOptimizer`'s, without the update function (a copy builds its own)."""
        state = super().__getstate__()
        state.pop("grad_func", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """As :class:`BridgedOptimizer`'s; a copy gets its update function and its hooks."""
        super().__setstate__(state)
        if "grad_func" not in self.__dict__ and "model" in self.__dict__:
            self.grad_func = self.fuse_update()
            self._hook_parameters()

    def _hook_parameters(self) -> None:
        """Hook the model's trainable parameters as the class's constructor does."""
        for _, param in self.model.named_parameters():
            if not param.requires_grad:
                continue
            if isinstance(self, lomo.AdaLOMO):
                param.register_hook(self.grad_func)
                continue
            hook = param.register_post_accumulate_grad_hook
            hook(self._update_parameter)  # type: ignore[no-untyped-call]

    def _update_parameter(self, param: torch.Tensor) -> None:
        """LOMO's hook: update ``param`` now that its gradient has accumulated."""
        self.grad_func(0, [param])


_LOSS_SCALING = ("loss_scaler", "loss_scale")
"""The attributes holding LOMO's and AdaLOMO's loss scaling (off when None)."""


def _factorable(params: Iterable[Any] | Prepared, algorithm: str) -> Any:
    """``params`` (a list if it was an iterable), refused unless every one is 1-D or 2-D.

    AdaLOMO keeps a second moment per vector and a row and a column factor per
    matrix; a 0-d parameter fails in its constructor upstream, a conv kernel
    at its first update.

    Raises:
        HyperparameterError: naming the parameter and its shape.
    """
    items = list(params.params if isinstance(params, Prepared) else params)
    for index, item in enumerate(items):
        name, tensor = item if isinstance(item, tuple) else (str(index), item)
        if isinstance(tensor, torch.Tensor) and tensor.ndim not in (1, 2):
            raise HyperparameterError(
                "params",
                f"{name} of shape {tuple(tensor.shape)}",
                "must be vectors or matrices (AdaLOMO factors the second moment of "
                "a matrix into a row and a column)",
                algorithm=algorithm,
            )
    return params if isinstance(params, Prepared) else items


_SEEDS = 1 << 62
"""Seeds of the wrapper's own random stream are drawn below this."""


@contextlib.contextmanager
def _seeded(seed: int, devices: list[int]) -> Iterator[None]:
    """Run the block on torch's and NumPy's global generators seeded with ``seed``.

    Their states are put back afterwards: the caller's random stream is left
    as it was.
    """
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed % _SEEDS)
        for index in devices:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed % _SEEDS)
        numpy_state = numpy.random.get_state()
        numpy.random.seed(seed % (1 << 32))
        try:
            yield
        finally:
            numpy.random.set_state(numpy_state)


class _DefaultFunction(NamedTuple):
    """A picklable reference to a function the class's constructor has as a default."""

    keyword: str


_FUNCTION_DEFAULTS: dict[type, dict[int, tuple[Any, str]]] = {}


def _function_defaults(cls: type) -> dict[int, tuple[Any, str]]:
    """``{id(function): (function, keyword)}`` for the functions ``cls.__init__`` defaults to."""
    if cls not in _FUNCTION_DEFAULTS:
        parameters = inspect.signature(cls).parameters.values()
        _FUNCTION_DEFAULTS[cls] = {
            id(p.default): (p.default, p.name) for p in parameters if inspect.isfunction(p.default)
        }
    return _FUNCTION_DEFAULTS[cls]


_TORCH_ATTRIBUTES = frozenset(vars(torch.optim.Optimizer([torch.zeros(1)], {})))
"""The attributes torch's ``Optimizer`` sets itself (its ``__setstate__`` restores them)."""


def _stored(kind: str, value: Any) -> Any:
    """One global state value as a plain group value: a 0-d tensor, a flat tuple or a number."""
    if kind == "tensor":
        return value.reshape(())
    return _encoded(value) if kind == "dict" else value


def _loaded(kind: str, stored: Any) -> Any:
    """Invert :func:`_stored` (but for a tensor's shape)."""
    return _decoded(stored) if kind == "dict" else stored


def _stored_attribute(kind: str, value: Any) -> Any:
    """An attribute as a plain group value: itself, or its object's state dict as a tree tuple."""
    if kind == "value" or value is None:
        return value
    tensors, layout = pack_value(value.state_dict())
    if tensors:
        raise TypeError("an attribute's state dict holding tensors cannot be a group value")
    return ("tree", *layout)


def _encoded(value: torch.dtype | dict[str, Any]) -> tuple[Any, ...]:
    """A dtype or a dict of plain values as a flat tuple of plain values."""
    if isinstance(value, torch.dtype):
        return ("torch.dtype", str(value).removeprefix("torch."))
    return ("dict", *(item for pair in sorted(value.items()) for item in pair))


def _decoded_groups(optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A load pre-hook: the dtype and dict group values :meth:`~BridgedOptimizer.state_dict` encoded, decoded.

    The loader then compares each saved hyperparameter with the optimizer's
    own in the same form (an encoded ``precondition_dtype`` was reported as
    changed from the ``torch.float32`` it stands for); the ``global:`` and
    ``attr:`` entries stay encoded for :meth:`~BridgedOptimizer._restore`.
    """
    del optimizer
    groups = state_dict.get("param_groups")
    if not isinstance(groups, (list, tuple)):
        return state_dict
    decoded = [
        {
            key: _decoded(value)
            if _is_encoded(value)
            and value[0] != "tree"
            and not key.startswith(("global:", "attr:"))
            else value
            for key, value in group.items()
        }
        if isinstance(group, dict)
        else group
        for group in groups
    ]
    return {**state_dict, "param_groups": decoded}


def _is_encoded(value: Any) -> bool:
    return isinstance(value, tuple) and value[:1] in (("torch.dtype",), ("dict",), ("tree",))


def _decoded(value: tuple[Any, ...]) -> Any:
    """The dtype, dict or tree :func:`_encoded` or :func:`_stored_attribute` stored."""
    if value[0] == "torch.dtype":
        return getattr(torch, value[1])
    if value[0] == "tree":
        return unpack_value(value[1:], [])
    items = value[1:]
    return dict(zip(items[0::2], items[1::2], strict=True))


_PLAIN = (type(None), bool, int, float, str)


def pack_value(value: Any) -> tuple[list[torch.Tensor], tuple[Any, ...]]:
    """A nested value as ``(its tensors, in order; its structure as plain values)``.

    The structure is written in prefix form: ``"tensor"`` (the next tensor),
    ``"value", v`` (a plain value), ``"dict", n`` then n keys and values,
    ``"object", class, n`` then n attribute names and values (an instance
    of one of the library's helper classes, see :func:`_packable_objects`),
    ``"list", n``, ``"tuple", n`` or ``"size", n`` (a ``torch.Size``) then
    n items, ``"deque", maxlen, n`` then n items.

    A tensor that is a non-contiguous view (GaLore's transposed orthogonal
    matrix) is stored as a contiguous copy, the layout a checkpoint restores,
    so a resumed run multiplies the same memory layouts, bit for bit.

    Raises:
        TypeError: a value of another type.
    """
    tensors: list[torch.Tensor] = []
    layout: list[Any] = []
    _pack_into(value, tensors, layout)
    return tensors, tuple(layout)


def _pack_into(value: Any, tensors: list[torch.Tensor], layout: list[Any]) -> None:
    if isinstance(value, torch.Tensor):
        layout.append("tensor")
        tensors.append(value.contiguous())  # as a checkpoint gives it back: same kernels after
    elif isinstance(value, _PLAIN):
        layout += ["value", _plain(value)]
    elif isinstance(value, dict) or _object_name(value):
        items = value if isinstance(value, dict) else vars(value)
        head = ["dict"] if isinstance(value, dict) else ["object", _object_name(value)]
        layout += [*head, len(items)]
        for key, item in items.items():
            _pack_into(key, tensors, layout)
            _pack_into(item, tensors, layout)
    elif isinstance(value, (list, tuple, deque)):
        layout += [*_sequence_head(value), len(value)]
        for item in value:
            _pack_into(item, tensors, layout)
    else:
        raise TypeError(f"cannot pack a {type(value).__name__}")


def _plain(value: Any) -> Any:
    """A plain value as its base type (an ``IntEnum`` member as its int)."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def _sequence_head(value: list[Any] | tuple[Any, ...] | deque[Any]) -> list[Any]:
    if isinstance(value, deque):
        return ["deque", value.maxlen]
    if isinstance(value, torch.Size):
        return ["size"]
    return ["tuple" if isinstance(value, tuple) else "list"]


def _packable_objects() -> dict[str, type]:
    """The library's helper classes whose instances per-parameter state may hold.

    Only these are rebuilt from a layout (a checkpoint names a class by its
    name here, never by an import path).
    """
    if not _OBJECTS:
        classes = (
            galore.GaLoreProjector,
            preconditioner.PreConditioner,
            partition.BlockPartitioner,
            graft.Graft,
            graft.SGDGraft,
            graft.SQRTNGraft,
            graft.AdaGradGraft,
            graft.RMSPropGraft,
        )
        _OBJECTS.update({cls.__name__: cls for cls in classes})
    return _OBJECTS


_OBJECTS: dict[str, type] = {}


def _object_name(value: Any) -> str:
    """The name :func:`_packable_objects` knows ``value``'s exact class by, else ""."""
    name = type(value).__name__
    return name if _packable_objects().get(name) is type(value) else ""


def unpack_value(layout: tuple[Any, ...], tensors: list[torch.Tensor]) -> Any:
    """Invert :func:`_packed`."""
    return _Reader(layout, tensors).node()


class _Reader:
    """Reads one prefix-form layout (see :func:`_packed`) back into its value."""

    def __init__(self, layout: tuple[Any, ...], tensors: list[torch.Tensor]) -> None:
        self.tokens = iter(layout)
        self.tensors = iter(tensors)

    def node(self) -> Any:
        tag = next(self.tokens)
        if tag == "tensor":
            return next(self.tensors)
        if tag == "value":
            return next(self.tokens)
        if tag == "dict":
            return self.mapping()
        if tag == "object":
            cls = _packable_objects()[next(self.tokens)]
            instance: Any = object.__new__(cls)
            vars(instance).update(self.mapping())
            return instance
        maxlen = next(self.tokens) if tag == "deque" else None
        items = [self.node() for _ in range(next(self.tokens))]
        if tag == "deque":
            return deque(items, maxlen=maxlen)
        if tag == "size":
            return torch.Size(items)
        return tuple(items) if tag == "tuple" else items

    def mapping(self) -> dict[Any, Any]:
        result = {}
        for _ in range(next(self.tokens)):
            key = self.node()
            result[key] = self.node()
        return result


def _with_use_muon(params: Iterable[Any] | Prepared) -> Any:
    """``params`` with every group carrying ``use_muon`` (split by dimension where absent)."""
    if isinstance(params, Prepared):
        return attrs.evolve(params, params=_with_use_muon(params.params))
    groups: list[dict[str, Any]] = []
    loose: list[Any] = []
    for item in params:
        if isinstance(item, dict):
            role = {"use_adamw": not item["use_muon"]} if "use_muon" in item else {}
            groups += [{**item, **role}] if role else _split(item)
        else:
            loose.append(item)
    if loose:
        named = all(isinstance(item, tuple) for item in loose)
        group: dict[str, Any] = {"params": [item[1] if named else item for item in loose]}
        if named:
            group["param_names"] = [item[0] for item in loose]
        groups += _split(group)
    return groups


def _split(group: dict[str, Any]) -> list[dict[str, Any]]:
    items = list(group["params"])
    named = items and all(isinstance(item, tuple) for item in items)
    tensors = [item[1] for item in items] if named else items
    names = [item[0] for item in items] if named else group.get("param_names")
    result = []
    for use_muon in (True, False):
        chosen = [i for i, p in enumerate(tensors) if (p.ndim >= 2) == use_muon]
        if chosen:
            part = {
                **group,
                "params": [tensors[i] for i in chosen],
                "use_muon": use_muon,
                "use_adamw": not use_muon,
            }
            if names is not None:
                part["param_names"] = [names[i] for i in chosen]
            result.append(part)
    return result


class ParameterModule(torch.nn.Module):
    """A module holding given parameters under their (dotted) names, and nothing else."""


def module_of(params: Iterable[Any]) -> torch.nn.Module:
    """A :class:`ParameterModule` holding ``params`` under their names.

    Args:
        params: tensors (named by position: ``"0"``, ``"1"``...) or ``(name,
            tensor)`` pairs; a dotted name (``"layer.weight"``) makes
            submodules, so ``named_parameters()`` gives the names back.

    Raises:
        TypeError: a param-group dict (the class makes its own groups).
    """
    root = ParameterModule()
    for index, item in enumerate(params):
        if isinstance(item, dict):
            raise TypeError(
                "this optimizer makes its own param groups from a model (AdamMini one per "
                "parameter, by name; LOMO and AdaLOMO one, with one setting for every "
                "parameter): give parameters or (name, parameter) pairs"
            )
        name, param = item if isinstance(item, tuple) else (str(index), item)
        *path, leaf = name.split(".")
        owner: torch.nn.Module = root
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, ParameterModule())
            owner = getattr(owner, part)
        if isinstance(param, torch.nn.Parameter):
            owner.register_parameter(leaf, param)
        else:  # a plain tensor (register_parameter takes Parameters only): held as it is
            owner._parameters[leaf] = param
    return root


def _from_parameters(cls: type) -> type:
    """A subclass of ``cls`` (whose first argument is a model) taking parameters instead."""
    init = next(k.__dict__["__init__"] for k in cls.__mro__ if "__init__" in k.__dict__)
    signature = inspect.signature(init)
    first = list(signature.parameters.values())[1]

    def __init__(self: Any, params: Iterable[Any], *args: Any, **kwargs: Any) -> None:
        init(self, module_of(params), *args, **kwargs)

    __init__.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[
            p.replace(name="params") if p is first else p for p in signature.parameters.values()
        ]
    )
    namespace = {
        "__init__": __init__,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
    }
    return type(cls.__name__, (cls,), namespace)


def wrapper(entry: Entry) -> type[ExternalOptimizer]:
    """The (cached) wrapper class of ``entry``."""
    name = class_name(entry)
    if name not in _BUILT:
        module, _, qualname = entry.target.partition(":")
        library_class = getattr(importlib.import_module(module), qualname)
        if entry.takes_model:
            library_class = _from_parameters(library_class)
        base = external_optimizer(
            f"{PLUGIN}:{entry.name}",
            library_class,
            config_class(entry),
            group_state=entry.group_state,
            name=name,
            module=__name__,
            needs_closure=entry.closure,
        )
        namespace = {
            "__module__": __name__,
            "__qualname__": name,
            "__doc__": base.__doc__,
            "__signature__": base.__dict__["__signature__"],
            "catalog_entry": entry,
        }
        bridged = FusedBackwardOptimizer if entry.fused_backward else BridgedOptimizer
        _BUILT[name] = type(name, (bridged, base), namespace)
    return _BUILT[name]


def __getattr__(name: str) -> Any:
    entry = _ENTRIES.get(name)
    if entry is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return wrapper(entry)
