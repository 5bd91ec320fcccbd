"""``Graph``: the training integration (module, data, optimizer, schedule, checkpoints, DDP)."""
