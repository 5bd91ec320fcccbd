"""The implementation chooser as a public building block (this module imports torch).

``impl=None`` asks its registry's ``Registry.chooser``
(an :class:`ImplementationChooser`): it drops the implementations that cannot
run (:func:`availability_reason`) or do not support the parameters, measures
the rest unless ``OPTIPLUG_AUTOTUNE`` is off (:func:`autotune_enabled`), and
keeps each decision in memory and in the cache file (:func:`cache_path`,
:func:`clear_cache`). A tool asks the same questions through these names,
as ``optiplug bench`` (distribution ``optiplug-devtools``) does.
"""

from __future__ import annotations

from ._choice.cache import cache_path, clear_cache
from ._choice.chooser import ImplementationChooser
from ._choice.timing import availability_reason, tensor_kinds
from ._compat import publish
from ._core.env import env_flag

__all__ = [
    "ImplementationChooser",
    "autotune_enabled",
    "availability_reason",
    "cache_path",
    "clear_cache",
    "tensor_kinds",
]


def autotune_enabled() -> bool:
    """Whether ``impl=None`` measures the implementations (``OPTIPLUG_AUTOTUNE`` is not off).

    Raises:
        EnvironmentVariableError: the variable is not a boolean word.
    """
    return env_flag("OPTIPLUG_AUTOTUNE", default=True)


publish(__name__, globals(), __all__)
