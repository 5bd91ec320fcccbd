"""Crash-safe file-system operations for checkpoints.

A checkpoint directory is written under a hidden temporary name in the same
parent (``.NAME.tmp-HOST-PID-XXXXXXXX``, with a hash standing in for ``NAME``
when the whole would not fit in a file name), every file fsynced, then moved
into place. Replacing an existing checkpoint uses Linux's atomic
``renameat2(RENAME_EXCHANGE)`` where the file system supports it; elsewhere
the old directory is first renamed aside (``.NAME.old-*``), leaving a moment
in which ``NAME`` is absent but the previous checkpoint is still complete on
disk. An ``OSError`` while saving (no space left, read-only file system,
permissions) is a :class:`~optiplug.errors.CheckpointError`; the temporary
directory is removed and an earlier checkpoint is left as it was.

Reading goes through :class:`OpenDirectory`: one handle on the directory,
every file opened relative to it, regular files only (no FIFOs, devices or
symbolic links), so a reader sees one checkpoint even while another process
replaces it, and can tell that it was replaced.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType

from ..errors import CheckpointError

__all__ = [
    "OpenDirectory",
    "fsync_directory",
    "publish_directory",
    "remove_stale_staging",
    "write_atomic_file",
    "write_durable",
]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV}
_DIRECTORY_MODE = 0o755
_NAME_MAX = 255
_PID_DIGITS = 10
_RANDOM_SUFFIX = "[a-z0-9_]{8}"  # what tempfile.mkdtemp/mkstemp append to the prefix
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_DIRECTORY_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
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


class OpenDirectory:
    """A directory held open: its files are read relative to one handle.

    Use it as a context manager. While it is open, another process renaming
    a new directory over the path does not change what is read (only files
    deleted from the held directory go missing); :meth:`replaced` tells
    whether that happened, so a reader can retry instead of reporting damage.
    """

    def __init__(self, path: Path) -> None:
        """Open ``path``.

        Raises:
            CheckpointError: it does not exist, is not a directory or cannot be opened.
        """
        self.path = Path(path)
        try:
            self.descriptor = os.open(self.path, _DIRECTORY_FLAGS)
        except OSError as error:
            raise _open_error(self.path, error) from error

    def __enter__(self) -> OpenDirectory:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        os.close(self.descriptor)

    def has(self, name: str) -> bool:
        """Whether the directory holds an entry ``name`` (of any kind)."""
        try:
            os.stat(name, dir_fd=self.descriptor, follow_symlinks=False)
        except OSError:
            return False
        return True

    def replaced(self) -> bool:
        """Whether the path now names another directory (or nothing) than the one held."""
        held = os.fstat(self.descriptor)
        try:
            now = os.stat(self.path)
        except OSError:
            return True
        return (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino)

    def read(self, name: str, what: str, limit: int, *, size: int | None = None) -> bytes:
        """Read the regular file ``name`` whole (symbolic links are not followed).

        Args:
            name: the file's name in the directory.
            what: what it is, for messages (``"metadata"``).
            limit: refuse a file larger than this many bytes.
            size: the exact size it must have, when known.

        Raises:
            CheckpointError: naming the file: missing, unreadable, not a
                regular file, too large, or not of the expected size.
        """
        where = self.path / name
        try:
            descriptor = os.open(name, _READ_FLAGS, dir_fd=self.descriptor)
        except OSError as error:
            raise _read_error(what, where, error) from error
        try:
            return _read_regular(descriptor, where, what, limit, size)
        except OSError as error:
            raise _read_error(what, where, error) from error
        finally:
            os.close(descriptor)


def _open_error(path: Path, error: OSError) -> CheckpointError:
    if error.errno == errno.ENOENT:
        return CheckpointError(f"no checkpoint at {path}: it does not exist")
    if error.errno == errno.ENOTDIR:
        return CheckpointError(f"no checkpoint at {path}: it is not a directory")
    return CheckpointError(f"cannot open checkpoint directory {path}: {_reason(error)}")


def _read_error(what: str, where: Path, error: OSError) -> CheckpointError:
    if error.errno == errno.ELOOP:
        message = (
            f"{what} {where} is a symbolic link; a checkpoint holds only regular files, "
            "refusing to follow it"
        )
        return CheckpointError(message)
    return CheckpointError(f"cannot read {what} {where}: {_reason(error)}")


def _read_regular(descriptor: int, where: Path, what: str, limit: int, size: int | None) -> bytes:
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "a special file")
        message = f"{what} {where} is {kind}, not a regular file; refusing to read it"
        raise CheckpointError(message)
    if size is not None and info.st_size != size:
        state = "truncated" if info.st_size < size else "longer than saved"
        raise CheckpointError(f"{where} is {state}: {info.st_size} bytes, the save wrote {size}")
    if info.st_size > limit:
        message = f"{what} {where} is larger than {limit} bytes; it is not an optiplug file"
        raise CheckpointError(message)
    with open(descriptor, "rb", closefd=False) as handle:
        data = handle.read(info.st_size + 1)
    if len(data) != info.st_size:
        raise CheckpointError(f"{what} {where} changed size while being read")
    return data


def _reason(error: OSError) -> str:
    """``"no space left on device (ENOSPC)"``: the system's words, and the code's name."""
    text = (error.strerror or str(error)).lower()
    code = errno.errorcode.get(error.errno or 0)
    return f"{text} ({code})" if code else text


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
        CheckpointError: ``path`` holds something other than a checkpoint,
            or an ``OSError`` (no space left, read-only, permissions...)
            stopped the save; the temporary directory is gone and an earlier
            checkpoint at ``path`` is unchanged.
    """
    path = Path(path)
    try:
        check_replaceable(path, allowed)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(path, marker=marker)
        staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(path), dir=path.parent))
    except OSError as error:
        raise _save_error(path, error) from error
    try:
        os.chmod(staging, _DIRECTORY_MODE)
        write(staging)
        fsync_directory(staging)
        _install(staging, path)
    except OSError as error:
        raise _save_error(path, error) from error
    finally:
        _discard(staging, marker)
    _sync_parent(path)
    with contextlib.suppress(OSError):  # the save is done; the sweep is housekeeping
        remove_stale_staging(path, marker=marker, committed=True)


def _save_error(path: Path, error: OSError) -> CheckpointError:
    where = f" (at {error.filename})" if error.filename and error.filename != str(path) else ""
    message = f"cannot save {path}: {_reason(error)}{where}; nothing was changed there"
    return CheckpointError(message)


def _sync_parent(path: Path) -> None:
    try:
        fsync_directory(path.parent)
    except OSError as error:
        message = f"{path} was saved, but its directory could not be synced: {_reason(error)}"
        raise CheckpointError(message) from error


def _discard(directory: Path, marker: str) -> None:
    """Delete ``directory``: its commit marker first (durably), then the rest (best effort)."""
    with contextlib.suppress(OSError):
        if (directory / marker).exists():
            (directory / marker).unlink()
            fsync_directory(directory)
    shutil.rmtree(directory, ignore_errors=True)


def _stem(path: Path) -> str:
    """The name staging entries carry for ``path``: its own, or a hash when that is too long."""
    longest = f".{path.name}.tmp-{socket.gethostname()}-{'9' * _PID_DIGITS}-{'x' * 8}"
    aside = f".{path.name}.old-{'x' * 32}"
    if max(len(os.fsencode(longest)), len(os.fsencode(aside))) <= _NAME_MAX:
        return path.name
    return "~" + hashlib.sha256(os.fsencode(path.name)).hexdigest()[:32]


def _staging_prefix(path: Path) -> str:
    """``.NAME.tmp-HOST-PID-``: whose save it was, so a later save can tell it is dead."""
    return f".{_stem(path)}.tmp-{socket.gethostname()}-{os.getpid()}-"


def _staging_pattern(path: Path) -> re.Pattern[str]:
    """Exactly the names :func:`_staging_prefix` and tempfile produce, the pid captured."""
    host = re.escape(socket.gethostname())
    return re.compile(
        rf"\.{re.escape(_stem(path))}\.tmp-{host}-([1-9][0-9]{{0,9}})-{_RANDOM_SUFFIX}"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's live process; not a pid
        return True
    return True


def remove_stale_staging(
    path: Path, *, marker: str | None = None, committed: bool = False
) -> list[Path]:
    """Delete temporaries of saves to ``path`` whose process died (killed mid-save).

    Only entries named exactly as this host's saves name them
    (``.NAME.tmp-HOST-PID-XXXXXXXX``) whose process no longer exists are
    considered, so a save in progress is never touched, nor a symbolic link
    or anything else a save does not create. A directory holding a commit
    marker is a complete checkpoint (a save killed just before or after its
    rename): it is deleted (marker first) only with ``committed``, which a
    save passes once a newer checkpoint is in place at ``path``.

    Args:
        path: the checkpoint (or file) whose temporaries to sweep.
        marker: the commit marker's file name, for directories.
        committed: also delete directories holding ``marker``.

    Returns:
        The temporaries removed.
    """
    pattern = _staging_pattern(path)
    removed = []
    for entry in _entries(path.parent):
        found = pattern.fullmatch(entry.name)
        if found is None or _pid_alive(int(found[1])):
            continue
        if _remove_stale(Path(entry.path), marker, committed):
            removed.append(Path(entry.path))
    return removed


def _entries(directory: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            yield from entries
    except (FileNotFoundError, NotADirectoryError):
        return


def _remove_stale(entry: Path, marker: str | None, committed: bool) -> bool:
    """Delete a temporary file, or a temporary directory (committed ones only if asked)."""
    mode = os.lstat(entry).st_mode
    if stat.S_ISREG(mode):
        entry.unlink()
        return True
    if not stat.S_ISDIR(mode):
        return False
    if marker is not None and os.path.lexists(entry / marker):
        if not committed:
            return False
        _discard(entry, marker)
        return True
    shutil.rmtree(entry, ignore_errors=True)
    return True


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
    aside = path.parent / f".{_stem(path)}.old-{uuid.uuid4().hex}"
    os.rename(path, aside)
    try:
        os.rename(staging, path)
    except OSError:
        os.rename(aside, path)
        raise
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

    Raises:
        CheckpointError: an ``OSError`` stopped it; ``path`` is unchanged.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(path)
        descriptor, name = tempfile.mkstemp(prefix=_staging_prefix(path), dir=path.parent)
    except OSError as error:
        raise _save_error(path, error) from error
    os.close(descriptor)
    temporary = Path(name)
    try:
        write(temporary)
        with open(temporary, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        raise _save_error(path, error) from error
    finally:
        temporary.unlink(missing_ok=True)
    _sync_parent(path)
