"""Reading optiplug's boolean environment variables, every one the same way.

``OPTIPLUG_STRICT_PLUGINS``, ``OPTIPLUG_AUTOTUNE`` and any later switch
accept ``1``/``true``/``yes``/``on`` and ``0``/``false``/``no``/``off``, in
any case and with surrounding whitespace; unset or blank means the default.
Anything else is refused with an
:class:`~optiplug.errors.EnvironmentVariableError`, so a misspelt switch is
never silently ignored.
"""

from __future__ import annotations

import os

from ..errors import EnvironmentVariableError

__all__ = ["FALSE_WORDS", "TRUE_WORDS", "env_flag"]

TRUE_WORDS = ("1", "true", "yes", "on")
"""Values that switch a boolean variable on (compared lowercased and stripped)."""

FALSE_WORDS = ("0", "false", "no", "off")
"""Values that switch a boolean variable off (compared lowercased and stripped)."""

_ACCEPTED = f"one of {', '.join(TRUE_WORDS + FALSE_WORDS)} (any case), or unset"


def env_flag(name: str, *, default: bool) -> bool:
    """Read the boolean environment variable ``name``.

    Args:
        name: the variable, e.g. ``"OPTIPLUG_AUTOTUNE"``.
        default: the value when it is unset or blank.

    Returns:
        True for :data:`TRUE_WORDS`, False for :data:`FALSE_WORDS`, else ``default``
        when unset or only whitespace.

    Raises:
        EnvironmentVariableError: any other value; names the variable and value.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvironmentVariableError(name, raw, _ACCEPTED)
