"""The optiplug error hierarchy.

Every error raised by optiplug subclasses :class:`OptiplugError` and, where it
fits, the builtin a PyTorch user already catches (``KeyError`` for unknown
names, ``ValueError`` for bad values, ``RuntimeError`` for things that cannot
be done right now). Each message is built in full before the raise and names
the field, parameter and value at fault.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "CheckpointError",
    "ClosureRequiredError",
    "EnvironmentVariableError",
    "GraphError",
    "HyperparameterError",
    "ImplementationError",
    "ModelConfigError",
    "NativeBuildError",
    "OptimizerUnavailableError",
    "OptiplugError",
    "PluginConflictError",
    "PluginError",
    "PluginUnavailable",
    "StateDictError",
    "TuneError",
    "UnknownOptimizerError",
    "UnknownScheduleError",
    "closest_name",
]


def closest_name(name: str, choices: Iterable[str]) -> str | None:
    """Return the choice closest to ``name``, or None when none is close.

    Args:
        name: what the user typed.
        choices: the valid names.

    Returns:
        The best match by :func:`difflib.get_close_matches`, or None.
    """
    matches = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


class OptiplugError(Exception):
    """Base class of every optiplug error."""


class PluginWarning(UserWarning):
    """A plugin could not be loaded; the others keep working.

    Also warned, once per process, for an implementation skipped because it
    failed. Published as ``optiplug.PluginWarning`` (a warning, not an error,
    so it is not in this module's ``__all__``); defined here so every layer
    that tolerates a broken plugin can warn with it.
    """


class UnknownOptimizerError(OptiplugError, KeyError):
    """No installed plugin provides the requested name.

    Attributes:
        name: the requested name.
        available: the names that do exist.
        suggestion: the closest existing name, if any.
    """

    kind = "optimizer"

    def __init__(self, name: str, available: Sequence[str], notes: Sequence[str] = ()) -> None:
        self.name = name
        self.available = tuple(sorted(available))
        self.suggestion = closest_name(name, self.available)
        hint = f" Did you mean {self.suggestion!r}?" if self.suggestion else ""
        listed = ", ".join(self.available) if self.available else "(none installed)"
        message = f"unknown {self.kind} {name!r}.{hint} Available: {listed}."
        for note in notes:
            message += f" {note}"
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class UnknownScheduleError(UnknownOptimizerError):
    """No installed plugin provides the requested schedule name."""

    kind = "schedule"


class OptimizerUnavailableError(OptiplugError, RuntimeError):
    """The name is known, but the plugin providing it cannot be used.

    Raised for a plugin that failed to import or register, was disabled, is
    incompatible, or lacks an optional dependency. Chained (``__cause__``) to
    the original exception when there was one.
    """


class ImplementationError(OptimizerUnavailableError):
    """A forced implementation (``impl=``) of an algorithm failed to build the optimizer.

    Chained (``__cause__``) to the implementation's own exception. When the
    implementation is not forced, a failing candidate is skipped with a
    :class:`~optiplug.PluginWarning` instead.
    """


class PluginError(OptiplugError, RuntimeError):
    """A plugin failed to load while strict plugin mode is on."""


class PluginUnavailable(OptiplugError, RuntimeError):
    """Raised by a plugin that cannot work here (e.g. no CUDA).

    A plugin raises it from its module body or a registration hook; the
    registry records the plugin as ``unavailable`` with the reason and the
    names it would have provided, instead of ``failed``.

    Args:
        reason: why the plugin cannot work, e.g. "CUDA is not available".
        provides: names the plugin would provide, so asking for one of them
            explains why it is missing.
    """

    def __init__(self, reason: str, provides: Iterable[str] = ()) -> None:
        self.reason = reason
        self.provides = tuple(provides)
        super().__init__(reason)

    @classmethod
    def unless_installed(
        cls, module: str, *, distribution: str | None = None, provides: Iterable[str] = ()
    ) -> None:
        """Raise one unless the top-level package ``module`` is installed; import nothing.

        A bridge calls it from its registration hook, so a missing library
        makes the plugin ``unavailable`` (its names say what to install)
        instead of every ``create`` failing on an import.

        Args:
            module: the importable top-level name (``"pytorch_optimizer"``).
            distribution: what ``pip install`` takes, when it differs.
            provides: the names the plugin would provide.

        Raises:
            PluginUnavailable: ``module`` cannot be imported here.
        """
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or blocked package: not importable
            found = False
        if not found:
            reason = f"{module} is not installed: pip install {distribution or module}"
            raise cls(reason, provides)


class PluginConflictError(OptiplugError, LookupError):
    """Two or more plugins provide one name; pick one with ``provider=``.

    Attributes:
        name: the contested name.
        providers: ``(plugin, distribution, version)`` of each provider.
        qualified: the qualified name (``"plugin:name"``) of each provider's
            record, which resolves to it alone.
    """

    def __init__(
        self,
        name: str,
        providers: Sequence[tuple[str, str, str]],
        *,
        qualified: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.providers = tuple(providers)
        self.qualified = tuple(qualified)
        described = "; ".join(
            f"plugin {plugin!r} from {dist} {version}" for plugin, dist, version in self.providers
        )
        choices = ", ".join(repr(plugin) for plugin, _, _ in self.providers)
        self.message = (
            f"{name!r} is provided by more than one plugin: {described}. "
            f"Pass provider= one of {choices} (a plugin or distribution name)"
        )
        if self.qualified:
            self.message += f", or use a qualified name: {', '.join(map(repr, self.qualified))}"
        self.message += "."
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


_WHOLE_SENTENCE_VALUES = frozenset({"<unknown keyword>", "<missing>"})
"""A :class:`HyperparameterError` value for which ``reason`` is the whole message."""


class HyperparameterError(OptiplugError, ValueError):
    """A hyperparameter (or schedule parameter) is invalid.

    The message reads ``adamw: invalid lr=-1: must be > 0.`` for a bad value.
    For a keyword that is unknown (``value`` is ``"<unknown keyword>"``) or
    missing (``"<missing>"``) there is no value to show, and ``reason`` is
    the whole message, e.g. ``unknown parameter 'warmup' for schedule
    cosine; did you mean 'warmup_steps'? (accepted: ...)``.

    Attributes:
        field: the hyperparameter's name.
        value: the rejected value (``"<unknown keyword>"`` or ``"<missing>"``
            for a keyword that is not accepted or not given).
        reason: the constraint it broke (the whole message for an unknown or
            missing keyword).
        algorithm: the algorithm or schedule it was given to, when known.
        suggestion: for an unknown name, the closest valid one.
    """

    def __init__(
        self,
        field: str,
        value: Any,
        reason: str,
        *,
        algorithm: str | None = None,
        suggestion: str | None = None,
    ) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.algorithm = algorithm
        self.suggestion = suggestion
        if isinstance(value, str) and value in _WHOLE_SENTENCE_VALUES:
            self.message = reason  # an unknown or missing keyword: the caller's full sentence
        else:
            where = f"{algorithm}: " if algorithm else ""
            hint = f" Did you mean {suggestion!r}?" if suggestion else ""
            self.message = f"{where}invalid {field}={value!r}: {reason}.{hint}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def for_algorithm(self, algorithm: str) -> HyperparameterError:
        """Return a copy of this error that names ``algorithm``.

        Args:
            algorithm: the algorithm or schedule name to mention.

        Returns:
            A new :class:`HyperparameterError` with the same field and value.
        """
        return HyperparameterError(
            self.field, self.value, self.reason, algorithm=algorithm, suggestion=self.suggestion
        )


class ClosureRequiredError(OptiplugError, TypeError):
    """``step()`` was called without the closure this optimizer needs (L-BFGS, SAM-like).

    Nothing ran. Pass ``step(closure)``, where the closure zeroes the
    gradients, computes the loss, calls ``backward`` and returns the loss,
    or step with ``optiplug.base.training_step(optimizer, loss_of)``, which
    builds it.

    Attributes:
        algorithm: the optimizer's registered name.
    """

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        super().__init__(
            f"{algorithm}: step() needs a closure that re-evaluates the model and returns "
            "the loss (zero the gradients, compute the loss, call backward, return it): "
            "call optimizer.step(closure), or step with "
            "optiplug.base.training_step(optimizer, loss_of)"
        )


class StateDictError(OptiplugError, ValueError):
    """An optimizer state dict failed validation; nothing was loaded.

    Attributes:
        problems: every problem found, sorted.
    """

    def __init__(
        self, problems: Sequence[Any], header: str = "invalid optimizer state dict"
    ) -> None:
        self.problems = tuple(problems)
        lines = [f"{header}: {len(self.problems)} problem(s)"]
        lines += [f"  - {problem}" for problem in self.problems]
        self.message = "\n".join(lines)
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class ModelConfigError(OptiplugError, ValueError):
    """A model config (``config.json``) is missing, unreadable or lacks what is needed."""


class CheckpointError(OptiplugError, ValueError):
    """A checkpoint on disk is missing, truncated, tampered with or foreign."""


class GraphError(OptiplugError, RuntimeError):
    """A Graph method was used out of order (no optimizer, no loader, live epoch...)."""


class TuneError(OptiplugError, ValueError):
    """``AutoOptimizer.tune`` cannot measure: too few batches or steps, a bad loss, nothing tuned."""


class NativeBuildError(OptiplugError, RuntimeError):
    """A native (C) kernel could not be built or loaded here: no compiler, a failed build, or switched off.

    Whoever asked for the kernel falls back to another implementation; the
    message names the compiler, the flags and the compiler's first lines of
    output.
    """


class EnvironmentVariableError(OptiplugError, ValueError):
    """An ``OPTIPLUG_*`` environment variable holds a value that cannot be read.

    The message reads ``environment variable OPTIPLUG_AUTOTUNE='maybe': expected
    ...``: the variable, its value and what it accepts.

    Attributes:
        variable: the variable's name.
        value: its value, as set.
        expected: what it accepts.
    """

    def __init__(self, variable: str, value: str, expected: str) -> None:
        self.variable = variable
        self.value = value
        self.expected = expected
        self.message = f"environment variable {variable}={value!r}: expected {expected}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message
