"""How many torch threads a run uses: the CPUs this process may actually use, never more.

Torch's own default is one thread per core of the machine. A container or a
job scheduler often lets a process use fewer (an affinity mask, a cgroup CPU
quota), and on a machine shared with other work more threads than CPUs make
every small operation wait for the slowest thread: a run can be several times
slower. So the default is the CPUs available to this process (the affinity
mask, capped by the cgroup quota), divided among ``--nproc`` processes.

Importing this module does not import torch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import attrs

__all__ = ["CpuBudget", "ThreadChoice", "choose_threads", "cgroup_cpu_quota", "cpu_budget"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where cgroup v2 (``cpu.max``) or v1 (``cpu/cpu.cfs_quota_us``) are mounted."""

_V1_DIRECTORIES = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@attrs.frozen
class CpuBudget:
    """The CPUs this process may use.

    Attributes:
        affinity: CPUs in the process's affinity mask (``os.sched_getaffinity``),
            or ``os.cpu_count()`` where there is no such call.
        quota: the cgroup CPU quota in whole CPUs (rounded up), None when
            there is none.
    """

    affinity: int
    quota: int | None = None

    @property
    def count(self) -> int:
        """The CPUs available: the affinity mask, capped by the quota (at least 1)."""
        return max(1, min(self.affinity, self.quota or self.affinity))

    def describe(self) -> str:
        """``"CPUs available to this process: 2; cgroup quota: none"``."""
        quota = "none" if self.quota is None else f"{self.quota} CPU(s)"
        return f"CPUs available to this process: {self.affinity}; cgroup quota: {quota}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _whole_cpus(quota: str, period: str) -> int | None:
    """``ceil(quota / period)``, or None for no quota (``max``, ``-1``) or unreadable values."""
    try:
        numerator, denominator = int(quota), int(period)
    except ValueError:
        return None  # "max": no quota
    if numerator <= 0 or denominator <= 0:
        return None  # -1: no quota
    return max(1, math.ceil(numerator / denominator))


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> int | None:
    """The cgroup CPU quota in whole CPUs, rounded up; None when there is none.

    cgroup v2: ``root/cpu.max`` holds ``"QUOTA PERIOD"`` (``"max PERIOD"``
    for none). cgroup v1: ``root/cpu/cpu.cfs_quota_us`` (``-1`` for none) and
    ``cpu.cfs_period_us``.

    Args:
        root: where the cgroup file system is mounted.

    Returns:
        ``ceil(quota / period)``, or None.
    """
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        fields = v2.split()
        return _whole_cpus(fields[0], fields[1]) if len(fields) == 2 else None
    for name in _V1_DIRECTORIES:
        quota = _read(root / name / "cpu.cfs_quota_us")
        period = _read(root / name / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            return _whole_cpus(quota, period)
    return None


def cpu_budget(root: Path = CGROUP_ROOT) -> CpuBudget:
    """The CPUs this process may use: its affinity mask and its cgroup quota.

    Args:
        root: where the cgroup file system is mounted.

    Returns:
        The :class:`CpuBudget`.
    """
    getaffinity = getattr(os, "sched_getaffinity", None)
    affinity = len(getaffinity(0)) if getaffinity is not None else (os.cpu_count() or 1)
    return CpuBudget(affinity=max(1, affinity), quota=cgroup_cpu_quota(root))


@attrs.frozen
class ThreadChoice:
    """The torch threads per process a run uses, and why.

    Attributes:
        threads: intra-op threads per process.
        why: where the number comes from, for the header.
    """

    threads: int
    why: str

    def describe(self) -> str:
        """``"2 (CPUs available to this process: 2; cgroup quota: none)"``."""
        return f"{self.threads} ({self.why})"


def choose_threads(
    requested: int | None,
    nproc: int = 1,
    *,
    given_by: str = "--threads",
    budget: CpuBudget | None = None,
) -> ThreadChoice:
    """The threads per process: ``requested`` if given, else the CPUs available divided by ``nproc``.

    Args:
        requested: the thread count asked for (``--threads``, or a resumed
            run's), or None for the default.
        nproc: processes sharing the CPUs.
        given_by: how ``requested`` was given, for the explanation.
        budget: the CPUs available (default: :func:`cpu_budget`).

    Returns:
        The :class:`ThreadChoice`.
    """
    if requested is not None:
        return ThreadChoice(requested, given_by)
    found = budget if budget is not None else cpu_budget()
    if nproc <= 1:
        return ThreadChoice(found.count, found.describe())
    share = max(1, found.count // nproc)
    return ThreadChoice(share, f"{found.describe()}; divided among {nproc} processes")
