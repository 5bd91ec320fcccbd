"""Crash-safe file-system operations for checkpoints.

A checkpoint directory is written under a hidden temporary name in the same
parent, every file fsynced, then moved into place. Replacing an existing
checkpoint uses Linux's atomic ``renameat2(RENAME_EXCHANGE)`` where the
file system supports it; elsewhere the old directory is first renamed aside
(``.NAME.old-*``), leaving a moment in which ``NAME`` is absent but the
previous checkpoint is still complete on disk.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import CheckpointError

__all__ = [
    "fsync_directory",
    "publish_directory",
    "read_bounded",
    "remove_stale_staging",
    "write_atomic_file",
    "write_durable",
]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}
_DIRECTORY_MODE = 0o755
_libc: ctypes.CDLL | None = None


def write_durable(path: Path, data: bytes) -> None:
    """Create ``path`` (it must not exist), write ``data`` and fsync it."""
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_directory(path: Path) -> None:
    """Fsync a directory so the names in it (new files, renames) are durable."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """Read a whole file, refusing one larger than ``limit`` bytes.

    Raises:
        CheckpointError: the file is missing, unreadable or too large.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        message = f"cannot read {what} {path}: {error.strerror or error}"
        raise CheckpointError(message) from error
    if len(data) > limit:
        message = f"{what} {path} is larger than {limit} bytes; it is not an optiplug file"
        raise CheckpointError(message)
    return data


def check_replaceable(path: Path, allowed: Iterable[str]) -> None:
    """Refuse to replace anything but an earlier checkpoint (or an empty directory).

    Raises:
        CheckpointError: ``path`` is a file, a link, or holds other files.
    """
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        message = f"{path} exists and is not a checkpoint directory; refusing to replace it"
        raise CheckpointError(message)
    foreign = sorted({child.name for child in path.iterdir()} - set(allowed))
    if foreign:
        message = (
            f"{path} holds files that are not part of an optiplug checkpoint "
            f"({', '.join(foreign[:5])}); refusing to replace it"
        )
        raise CheckpointError(message)


def publish_directory(
    path: Path, write: Callable[[Path], None], allowed: Iterable[str], *, marker: str
) -> None:
    """Write a directory with ``write(temporary_dir)`` and move it to ``path`` atomically.

    The replaced checkpoint ends up in the temporary directory and is deleted
    marker first, so a process killed while deleting it leaves a directory
    that says "unfinished" rather than a committed one with files missing.

    Args:
        path: the final directory; an earlier checkpoint there is replaced.
        write: fills the temporary directory (fsyncing each file).
        allowed: the file names a checkpoint holds (anything else at
            ``path`` is not replaced).
        marker: the commit marker's file name (written last, deleted first).

    Raises:
        CheckpointError: ``path`` holds something other than a checkpoint.
    """
    path = Path(path)
    check_replaceable(path, allowed)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(path)
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(path), dir=parent))
    try:
        os.chmod(staging, _DIRECTORY_MODE)
        write(staging)
        fsync_directory(staging)
        _install(staging, path)
    finally:
        _discard(staging, marker)
    fsync_directory(parent)


def _discard(directory: Path, marker: str) -> None:
    """Delete ``directory``: its commit marker first (durably), then the rest."""
    if not directory.exists():
        return
    if (directory / marker).exists():
        (directory / marker).unlink()
        fsync_directory(directory)
    shutil.rmtree(directory, ignore_errors=True)


def _staging_prefix(path: Path) -> str:
    """``.NAME.tmp-HOST-PID-``: whose save it was, so a later save can tell it is dead."""
    return f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_staging(path: Path) -> list[Path]:
    """Delete temporaries of saves to ``path`` whose process died (killed mid-save).

    Only this host's temporaries are considered, and only those whose process
    no longer exists, so a save in progress elsewhere is never touched.

    Returns:
        The temporaries removed.
    """
    prefix = f".{path.name}.tmp-{socket.gethostname()}-"
    removed = []
    for entry in (
        path.parent.glob(f".{glob.escape(path.name)}.tmp-*") if path.parent.is_dir() else ()
    ):
        pid_text = entry.name[len(prefix) :].split("-", 1)[0]
        if entry.name.startswith(prefix) and pid_text.isdigit() and not _pid_alive(int(pid_text)):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _install(staging: Path, path: Path) -> None:
    """Move ``staging`` to ``path``; afterwards ``staging`` holds the old one, if any."""
    if not os.path.lexists(path):
        try:
            os.rename(staging, path)
            return
        except OSError:
            if not os.path.lexists(path):
                raise
    if _exchange(staging, path):
        return
    aside = path.parent / f".{path.name}.old-{uuid.uuid4().hex}"
    os.rename(path, aside)
    os.rename(staging, path)
    os.rename(aside, staging)


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux); False where not supported."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    result = renameat2(
        _AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE
    )
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(second))


def _renameat2() -> Callable[..., int] | None:
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    try:
        _libc = _libc or ctypes.CDLL(None, use_errno=True)
        function = _libc.renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    function.restype = ctypes.c_int
    return function


def write_atomic_file(path: Path, write: Callable[[Path], None]) -> None:
    """Write a single file through a temporary sibling, fsync, rename over ``path``.

    Args:
        path: the destination file.
        write: writes the temporary file at the path it is given.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(path)
    descriptor, name = tempfile.mkstemp(prefix=_staging_prefix(path), dir=path.parent)
    os.close(descriptor)
    temporary = Path(name)
    try:
        write(temporary)
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
    fsync_directory(path.parent)
