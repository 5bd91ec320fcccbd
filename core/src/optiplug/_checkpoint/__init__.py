"""The on-disk checkpoint format behind :mod:`optiplug.checkpoint` (files, hashes, commits)."""
