"""The plugin core: records, hook specs, the registry, creation and implementation choice.

Imports only the bottom layer (``errors``, ``validators``, ``_lazy``,
``_text``); everything else in optiplug builds on this package.
"""
