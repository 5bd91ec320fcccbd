"""The leaderboard: a workload suite, resumable runs of the catalogue on it, the board."""
