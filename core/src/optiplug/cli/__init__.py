"""The ``optiplug`` command line (also ``python -m optiplug``), and helpers for command plugins.

A plugin's command (a :class:`~optiplug.CommandSpec` from the
``optiplug_cli_commands`` hook) parses and prints the way the built-in ones
do with :func:`parse_param` (``--param key=value``), :func:`parse_count`
(``--params 7B``), :func:`read_negative_values` (``--option -1``),
:func:`check_plot_path` (refuse an unwritable ``--plot`` before any work),
:func:`format_table` and :func:`format_bytes`.
Importing this package imports no torch.
"""

from __future__ import annotations

from .._compat import publish
from .._text import format_table
from .listing import format_bytes, parse_count, read_negative_values
from .main import main
from .schedule import check_plot_path, parse_param

__all__ = [
    "check_plot_path",
    "format_bytes",
    "format_table",
    "main",
    "parse_count",
    "parse_param",
    "read_negative_values",
]

publish(__name__, globals(), __all__)
