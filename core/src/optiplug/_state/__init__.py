"""Optimizer state dicts: value checks, whole-dict validation, all-or-nothing loading."""
