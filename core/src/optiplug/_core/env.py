"""Reading optiplug's boolean environment variables, every one the same way.

``OPTIPLUG_STRICT_PLUGINS``, ``OPTIPLUG_AUTOTUNE`` and any later switch
accept ``1``/``true``/``yes``/``on`` and ``0``/``false``/``no``/``off``, in
any case and with surrounding whitespace; unset or blank means the default.
Anything else is refused with an
:class:`~optiplug.errors.EnvironmentVariableError`, so a misspelt switch is
never silently ignored.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from pathlib import Path

import platformdirs

from ..errors import EnvironmentVariableError

__all__ = [
    "CACHE_DIRECTORY_VARIABLE",
    "FALSE_WORDS",
    "TRUE_WORDS",
    "cache_directory",
    "cpu_model",
    "env_flag",
]

TRUE_WORDS = ("1", "true", "yes", "on")
"""Values that switch a boolean variable on (compared lowercased and stripped)."""

FALSE_WORDS = ("0", "false", "no", "off")
"""Values that switch a boolean variable off (compared lowercased and stripped)."""

CACHE_DIRECTORY_VARIABLE = "OPTIPLUG_CACHE_DIR"
"""Environment variable: the directory of optiplug's per-machine files (measured choices, built kernels)."""

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


def cache_directory() -> Path:
    """``$OPTIPLUG_CACHE_DIR``, else the platform's user cache directory for optiplug.

    The platform's directory is :mod:`platformdirs`' ``user_cache_dir``:
    ``$XDG_CACHE_HOME/optiplug``, else ``~/.cache/optiplug`` on Linux,
    ``~/Library/Caches/optiplug`` on macOS and
    ``%LOCALAPPDATA%\\optiplug\\Cache`` on Windows.

    Returns:
        The directory of optiplug's per-machine files (it may not exist yet).

    Raises:
        RuntimeError: no variable is set and the home directory cannot be found.
    """
    own = os.environ.get(CACHE_DIRECTORY_VARIABLE, "").strip()
    if own:
        return Path(own).expanduser()
    return Path(platformdirs.user_cache_dir("optiplug", appauthor=False))


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """``model name`` from ``/proc/cpuinfo``, else :func:`platform.processor`, else the machine.

    Returns:
        E.g. ``"AMD EPYC 7B13"``; what a kernel built for this CPU, or a
        choice measured on it, is keyed by.
    """
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine() or "unknown"
