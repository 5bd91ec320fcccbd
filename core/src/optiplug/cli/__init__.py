"""The ``optiplug`` command line (also ``python -m optiplug``)."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
