"""Using optiplug from other training frameworks: what the core provides for them.

The framework adapters are the ``optiplug-integrations`` distribution
(``pip install "optiplug[integrations]"``): ``optiplug_integrations.transformers``
(the Hugging Face ``Trainer``), ``.layerwise``, ``.lightning`` and ``.timm``.
Their 0.1.0 paths here (``optiplug.integrations.transformers``, ...) still
import, with a ``DeprecationWarning``, where that distribution is installed.

Otherwise Lightning needs nothing: a factory and a schedule are ordinary
hyperparameters, and they load under ``torch.load(..., weights_only=True)``
(what ``load_from_checkpoint`` and ``trainer.fit(ckpt_path=...)`` use) because
``import optiplug`` allowlists them; :func:`safe_globals` lists what is
allowlisted. See ``docs/integrations.md`` for the recipes.
"""

from __future__ import annotations

from typing import Any

from .._compat import weights_only_globals

__all__ = ["safe_globals"]


def safe_globals() -> list[Any]:
    """What optiplug allowlists for ``torch.load(..., weights_only=True)``.

    ``import optiplug`` registers these with
    ``torch.serialization.add_safe_globals`` itself (at once when torch is
    already imported, else right after ``import torch``), so users need not;
    this list is for code that resets torch's allowlist
    (``torch.serialization.clear_safe_globals()``) or wants it scoped::

        with torch.serialization.safe_globals(optiplug.integrations.safe_globals()):
            torch.load(path, weights_only=True)

    Returns:
        :class:`~optiplug.OptimizerFactory`, :class:`~optiplug.Selection` and
        the records it holds (:class:`~optiplug.CandidateReport`,
        :class:`~optiplug.Candidate`, :class:`~optiplug.SelectionRequest`,
        :class:`~optiplug.ProviderInfo`), :class:`~optiplug.Schedule` and every
        class of :mod:`optiplug.builtin_schedules`; each also as a
        ``(class, "old.path")`` pair for the module path optiplug 0.1.0
        pickled it under.
    """
    return weights_only_globals()
