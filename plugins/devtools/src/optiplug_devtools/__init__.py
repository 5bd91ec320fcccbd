"""optiplug-devtools: tools for plugin authors, built on optiplug's public API.

Two commands, registered through the ``optiplug_cli_commands`` hook as any
plugin's are: ``optiplug bench`` times every implementation of an algorithm
against a copy of the bytes its update moves, and marks what ``impl=None``
picks; ``optiplug new-plugin NAME`` writes a working plugin distribution to
edit, install and test. Importing this package imports no torch.
"""

__all__: list[str] = []
