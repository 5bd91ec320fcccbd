"""The record types of the catalogue (torch-free): one entry per bridged optimizer."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["REQUIRED", "Entry", "LibraryDefault", "Param", "Slot"]


class LibraryDefault:
    """A default that has no torch-free literal (a dtype, a function): the class's own is used.

    The keyword is not passed to the class unless the user gives it.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"<library default: {self.text}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LibraryDefault) and other.text == self.text

    def __hash__(self) -> int:
        return hash(("LibraryDefault", self.text))


class _Required:
    """The default of a keyword the class requires (``num_data`` of BSAM)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()
"""The default of a keyword the class requires."""


class Param(NamedTuple):
    """One keyword of the class.

    Attributes:
        name: the keyword.
        default: its default (:class:`LibraryDefault` when it has no literal,
            :data:`REQUIRED` when the class requires it).
        kind: ``"float"``, ``"int"``, ``"bool"``, ``"str"``, ``"betas"``, the
            same with ``"?"`` when None is accepted, or ``"any"``.
        constraint: the range: ``("lr",)``, ``("non_negative",)``,
            ``("positive",)``, ``("non_positive",)``, ``("step",)``,
            ``("range", low, high, "[)")``, ``("betas", "[)", ...)`` (one
            range type per beta), ``("options", (...))`` or ``()``.
        source: ``"library"`` where the class checks the keyword itself (the
            constraint may be stricter: a finite ``lr``, a positive ``eps``),
            ``"optiplug"`` where only optiplug's well-known rule does
            (``momentum`` in [0, 1) for a class that does not check it).
    """

    name: str
    default: Any
    kind: str
    constraint: tuple[Any, ...]
    source: str = "library"


class Slot(NamedTuple):
    """One per-parameter state entry, as the class keeps it (see ``optiplug.StateSlot``)."""

    name: str
    kind: str
    shape: str
    dtype: str
    finite: bool
    when: str | None
    optional: bool = False
    """Kept for some parameters only (matrices, or vectors): its absence is fine."""


class Entry(NamedTuple):
    """One bridged optimizer.

    ``group_tensors`` names the param-group keys the class keeps as
    non-scalar tensors (``(key, shape)``; saved as 0-d tensors, see the
    wrapper); ``global_state`` names what the class keeps in
    ``optimizer.state`` under a key that is no parameter (``(key, "tensor",
    "dict" or "number", shape)``; saved in the first param group as
    ``global:<key>``); ``attributes`` names the running state the class
    keeps as attributes of the optimizer (``(name, "value" or
    "state_dict")``: a plain value, or an object with
    ``state_dict``/``load_state_dict``; saved in the first param group as
    ``attr:<name>``); ``named_state`` names the attributes holding
    per-parameter state in dicts keyed by parameter name (AdaLOMO's
    ``exp_avg_sq``), kept in ``optimizer.state[param]`` under the
    attribute's name too (the same tensors); ``packed`` names the
    per-parameter slots holding nested containers (a dict, a deque, a list
    of dicts), kept between steps as a list of their tensors and a
    ``<slot>:layout`` tuple; ``muon_groups`` marks the Muon family, whose
    groups need ``use_muon``; ``closure`` marks a class whose ``step`` needs
    a closure and ``create_graph`` one whose gradients must keep their
    graph; ``takes_model`` one whose first argument is a model, not
    parameters (the wrapper builds a module holding the given parameters
    under their names); ``fused_backward`` one that updates the parameters
    inside the backward pass, from hooks on them, when driven by its own
    ``fused_backward(loss, lr)`` (LOMO, AdaLOMO; the wrapper makes
    ``backward()`` then ``step()`` work too); ``own_rng`` one whose step
    draws random numbers, which the wrapper draws from a stream of its own
    (seed and step count saved as
    ``attr:bridge_rng_seed``/``attr:bridge_rng_step``); ``unavailable``
    names implementations its signature offers that never run, with why
    (``(impl, reason)``); ``limitation`` says why it cannot pass optiplug's
    checks; ``deviations`` names single conformance checks it cannot meet,
    with why.
    """

    name: str
    target: str
    params: tuple[Param, ...]
    paper: str = ""
    summary: str = ""
    flags: tuple[str, ...] = ()
    slots: tuple[Slot, ...] | None = None
    slots_note: str = ""
    group_state: tuple[str, ...] = ()
    group_tensors: tuple[tuple[str, tuple[int, ...]], ...] = ()
    global_state: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    attributes: tuple[tuple[str, str], ...] = ()
    packed: tuple[str, ...] = ()
    muon_groups: bool = False
    closure: bool = False
    create_graph: bool = False
    own_rng: bool = False
    takes_model: bool = False
    fused_backward: bool = False
    named_state: tuple[str, ...] = ()
    unavailable: tuple[tuple[str, str], ...] = ()
    limitation: str = ""
    deviations: tuple[tuple[str, str], ...] = ()
    example_hparams: dict[str, Any] = {}  # noqa: RUF012  # a NamedTuple default, never mutated
    example_dtype: str | None = None
    train_eval: bool = False
