"""optiplug-integrations: optiplug in the training frameworks users already have.

Each framework has its own submodule, imported only when used (importing
this package imports none of them, nor the framework):

* :mod:`optiplug_integrations.transformers`: optiplug optimizers in the
  Hugging Face ``Trainer`` (``optimizer_cls_and_kwargs=``, ``TrainingArguments.optim``).
* :mod:`optiplug_integrations.layerwise`: one optimizer per parameter,
  stepped from its gradient hook, scheduled and checkpointed as one
  (the Trainer's ``*_layerwise`` names).
* :mod:`optiplug_integrations.lightning`: ``ScheduleFreeMode``, a callback
  keeping a schedule-free optimizer in train mode for training steps and in
  eval mode for validation, test, predict and checkpoints.
* :mod:`optiplug_integrations.timm`: every optiplug name in timm's optimizer
  registry (``timm.optim.create_optimizer_v2(model, "optiplug:lion")``).

Built on optiplug's public API only. What Lightning needs otherwise (a
factory and a schedule load under ``torch.load(..., weights_only=True)``)
is the core's: :func:`optiplug.integrations.safe_globals`.
"""

__all__: list[str] = []
