"""Small C kernels built at run time with the system's C compiler, kept per machine.

``torch.compile`` on a CPU also generates C++ and builds it with the system
compiler, but its first build in a process costs 6-20 s on two cores
(importing dynamo and inductor takes about 2.5 s, and its code is built
against ATen's headers). A page of plain C loops builds faster, but not at
once. Measured from an empty cache with GCC and ``-O3 -march=native
-fopenmp`` on two shared cores (``benchmarks/bench_first_steps.py
--state-precision int8``): Lion's fused kernel 0.09-0.18 s, the codec's
loops 0.3-0.8 s, the SGD and Lion state steps 0.4-1.3 s and Adam's C state
step 1.8-4.8 s (its AVX-512 paths unrolled), about three times as long
while training steps keep both cores busy; loading one kept from an earlier
process takes under a millisecond.

:func:`build_c_library` builds a C source into a shared library and loads
it with :mod:`ctypes` (whose calls release the GIL), waiting for the
compiler. A training step never waits: :func:`library_when_ready` starts
the build in a background thread (the compiler is a subprocess) on first
need and returns None until the library is loaded, so the step runs its
torch ops meanwhile and takes the C kernel from a later step on; both
write the same state layout. The background builds run one at a time, in
the order they were first asked for, so one compiler at most competes with
the steps for the cores. The library is kept in ``kernels/`` under
optiplug's cache directory (``$OPTIPLUG_CACHE_DIR``, else the platform's
user cache directory; see :func:`optiplug._core.env.cache_directory`), named
by a digest of the source, the compiler's identity, the flags and the CPU
model, so a later process loads it without building, and a machine with
another CPU or compiler builds its own. It is written to a temporary file
beside it and renamed (atomic), so processes building at once into one
cache directory never see half a file. When the directory cannot be
written, the library is built in a temporary directory. A build still
running when the interpreter exits is stopped and its partial file removed.

The flags keep IEEE arithmetic (no ``-ffast-math``, no contraction into
fused multiply-adds, so results round as torch's eager ops do) and try, in
order: ``-march=native -fopenmp``, then without OpenMP (a compiler without
it, such as Apple's clang: the kernels then run single-threaded), then
without ``-march=native``. The compiler is ``$CC``, else the first of
``cc``, ``gcc``, ``clang`` found. ``OPTIPLUG_NATIVE=0`` (or ``false``,
``no``, ``off``) switches native kernels off. A compiler that is missing,
whose ``--version`` exits non-zero, or that builds no flag set (each
compile's exit code is checked) makes the callers fall back to torch ops
with one :class:`~optiplug.PluginWarning` per process (:func:`warn_unbuilt`).

Importing this module imports neither torch nor a compiler.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import queue
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from ._core.env import cache_directory, cpu_model, env_flag
from ._core.registry import PluginWarning
from .errors import NativeBuildError

__all__ = [
    "FLAG_SETS",
    "NATIVE_VARIABLE",
    "UNBUILT_COST",
    "NativeLibrary",
    "build_c_library",
    "library_when_ready",
    "warn_unbuilt",
]

NATIVE_VARIABLE = "OPTIPLUG_NATIVE"
"""Environment variable: a switch, on by default; off, no native kernel is built or loaded."""

_COMMON_FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared", "-ffp-contract=off")

FLAG_SETS: tuple[tuple[str, ...], ...] = (
    (*_COMMON_FLAGS, "-march=native", "-fopenmp"),
    (*_COMMON_FLAGS, "-march=native"),
    _COMMON_FLAGS,
)
"""The compiler flags tried, in order, until one set builds."""

_BUILD_SECONDS = 120.0
"""How long one build may take before it counts as failed."""


@attrs.frozen(eq=False)
class NativeLibrary:
    """A built and loaded C library.

    Attributes:
        name: the name it was asked for under (part of the file name).
        path: the shared library's file.
        flags: the compiler flags it was built with.
        library: the loaded library (:meth:`function` binds one of its
            functions with its argument types).
    """

    name: str
    path: Path
    flags: tuple[str, ...]
    library: ctypes.CDLL = attrs.field(repr=False)

    @property
    def openmp(self) -> bool:
        """Whether it was built with OpenMP (its ``#pragma omp`` loops run in parallel)."""
        return "-fopenmp" in self.flags

    def function(self, symbol: str, argtypes: Sequence[Any], restype: Any = None) -> Any:
        """The exported C function ``symbol``, its argument and result types set.

        Args:
            symbol: the function's name in the library.
            argtypes: its parameters' :mod:`ctypes` types, in order.
            restype: its result's type (None for ``void``).

        Returns:
            The callable :mod:`ctypes` function (its calls release the GIL).

        Raises:
            AttributeError: the library exports no such function.
        """
        found = getattr(self.library, symbol)
        found.argtypes, found.restype = list(argtypes), restype
        return found


def build_c_library(source: str, *, name: str) -> NativeLibrary:
    """Build C ``source`` into a shared library (or find it built) and load it, waiting.

    A training step calls :func:`library_when_ready` instead, which never
    waits for the compiler.

    Args:
        source: a complete C11 translation unit exporting the functions.
        name: a short name for the file, letters, digits, ``-`` and ``_``.

    Returns:
        The loaded library and how it was built.

    Raises:
        NativeBuildError: native kernels are switched off, no C compiler is
            found, or no flag set builds and loads ``source``.
        ValueError: ``name`` holds other characters.
    """
    _check_name(name)
    if not env_flag(NATIVE_VARIABLE, default=True):
        raise NativeBuildError(f"native kernels are switched off ({NATIVE_VARIABLE}=0)")
    return _built(source, name, _wanted_compiler(), _kernel_directory())


def library_when_ready(source: str, *, name: str, wait: bool = False) -> NativeLibrary | None:
    """The library of ``source`` once it is built; until then None, the build running aside.

    The first call starts the build in a background thread (the compiler
    runs as a subprocess, so the caller's steps go on meanwhile); later calls
    return None while it runs and the loaded library once it is done. The
    build is tried once per process for each source and compiler (``$CC``),
    into the cache directory set when it starts: a failure returns None from
    then on and warns once per process (:func:`warn_unbuilt`, from the
    caller's thread).

    Args:
        source: a complete C11 translation unit exporting the functions.
        name: a short name for the file, letters, digits, ``-`` and ``_``.
        wait: wait for the build to finish (tests, benchmarks and callers
            outside a training step) rather than return None while it runs.

    Returns:
        The loaded library, or None: still building, switched off
        (``OPTIPLUG_NATIVE=0``, no warning), or it could not be built.

    Raises:
        ValueError: ``name`` holds other characters.
    """
    _check_name(name)
    if not env_flag(NATIVE_VARIABLE, default=True):
        return None
    build = _background_build(source, name)
    if wait:
        build.done.wait()
    if not build.done.is_set():
        return None
    if build.error is not None and not build.reported:
        build.reported = True
        warn_unbuilt(str(build.error))
    return build.library


@attrs.define(eq=False)
class _Build:
    """One library's build in a background thread: done once it is loaded or has failed."""

    done: threading.Event = attrs.field(factory=threading.Event)
    library: NativeLibrary | None = None
    error: NativeBuildError | None = None
    reported: bool = False


_BUILDS: dict[tuple[str, str, str], _Build] = {}
_BUILDS_LOCK = threading.Lock()


def _background_build(source: str, name: str) -> _Build:
    """The build of ``source`` by this compiler in this process, started if new.

    The cache directory is the one set when it starts (a later change of
    ``$OPTIPLUG_CACHE_DIR`` does not build it again).
    """
    wanted = _wanted_compiler()
    key = (name, source, wanted)
    with _BUILDS_LOCK:
        build = _BUILDS.get(key)
        if build is not None:
            return build
        build = _BUILDS[key] = _Build()
    # the inputs are read here, in the caller's thread and environment
    _QUEUE.put((build, source, name, wanted, _kernel_directory()))
    with _BUILDS_LOCK:
        global _worker
        if _worker is None:
            _worker = threading.Thread(target=_build_queued, name="optiplug-build", daemon=True)
            _worker.start()
    return build


_QUEUE: queue.SimpleQueue[tuple[_Build, str, str, str, Path]] = queue.SimpleQueue()
"""The builds asked for, built one at a time in order (one compiler competes with the steps)."""
_worker: threading.Thread | None = None


def _build_queued() -> None:
    """The background thread: the queued builds, first asked first built."""
    while True:
        _build_aside(*_QUEUE.get())


def _build_aside(build: _Build, source: str, name: str, wanted: str, directory: Path) -> None:
    """One background build: ``build`` is done when its library is loaded or it failed."""
    try:
        build.library = _built(source, name, wanted, directory)
    except NativeBuildError as error:
        build.error = error
    except Exception as error:  # an unexpected failure still ends the wait, as a build error
        build.error = NativeBuildError(f"building {name!r} failed: {error!r}")
    finally:
        build.done.set()


def _built(source: str, name: str, wanted: str, directory: Path) -> NativeLibrary:
    """``source`` built (or loaded) by compiler ``wanted`` into ``directory``."""
    compiler = _compiler(wanted)
    failures = []
    for flags in FLAG_SETS:
        target = _library_path(source, name, compiler, flags, directory)
        try:
            return NativeLibrary(
                name, target, flags, _load_or_build(source, compiler, flags, target)
            )
        except NativeBuildError as error:
            failures.append(str(error))
    raise NativeBuildError(f"could not build {name!r} with {compiler[0]}: " + "; ".join(failures))


def _check_name(name: str) -> None:
    if not name or not all(ch.isalnum() or ch in "-_" for ch in name):
        raise ValueError(f"name {name!r} must be letters, digits, '-' and '_'")


def _wanted_compiler() -> str:
    """``$CC`` (empty: search the usual names)."""
    return os.environ.get("CC", "").strip()


@functools.cache
def _compiler(wanted: str) -> tuple[str, str]:
    """``(executable, first line of its --version)``: ``wanted`` (``$CC``), else ``cc``, ``gcc``, ``clang``."""
    candidates = [wanted] if wanted else ["cc", "gcc", "clang"]
    found = next((path for path in map(shutil.which, candidates) if path), None)
    if found is None:
        raise NativeBuildError(f"no C compiler found (tried {', '.join(candidates)}; set CC)")
    try:
        run = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise NativeBuildError(f"the C compiler {found} does not run: {error}") from error
    if run.returncode != 0:
        said = " ".join((run.stderr or run.stdout).strip().splitlines()[:2])
        raise NativeBuildError(
            f"the C compiler {found} --version exited {run.returncode}: {said or 'no output'}"
        )
    return found, (run.stdout.splitlines() or [""])[0]


UNBUILT_COST = (
    "each int8 AdamW step roughly 10x slower on a 2-core CPU, and far more while the "
    "machine is busy"
)
"""What running without the C kernels costs where it was measured: int8 AdamW over 4 x 2**18
parameters, the median step after the C step was loaded against ``OPTIPLUG_NATIVE=0``'s, 32
against 303 ms on two shared cores (9.5x; 327x on a busier run; see docs/performance.md)."""


@functools.cache
def _unbuilt() -> list[str]:
    """The build failures reported in this process (the first one was warned about)."""
    return []


def warn_unbuilt(error: str) -> None:
    """Warn once per process that the C kernels could not be built, with the cost and the fix.

    Later failures (another kernel, the same missing compiler) are recorded
    without a warning; nothing is said when the kernels are switched off on
    purpose (``OPTIPLUG_NATIVE=0``).

    Args:
        error: why the build failed (:class:`~optiplug.errors.NativeBuildError`'s message).
    """
    if not env_flag(NATIVE_VARIABLE, default=True):
        return
    seen = _unbuilt()
    seen.append(error)
    if len(seen) > 1:
        return
    warnings.warn(
        f"optiplug: the C kernels are unavailable ({error}), so low-precision optimizer "
        f"state and the fused CPU steps run on torch ops instead ({UNBUILT_COST}); install "
        "a C compiler (gcc or clang) or point CC at one, or set OPTIPLUG_NATIVE=0 to use "
        "torch ops without this warning",
        PluginWarning,
        stacklevel=2,
    )


def _library_path(
    source: str, name: str, compiler: tuple[str, str], flags: tuple[str, ...], directory: Path
) -> Path:
    """Where the library built from these inputs is kept."""
    identity = "\0".join([source, *compiler, *flags, platform.machine(), cpu_model()])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:20]
    suffix = ".dll" if os.name == "nt" else ".so"
    return directory / f"{name}-{digest}{suffix}"


def _kernel_directory() -> Path:
    """``kernels/`` in the cache directory, or a temporary directory when that cannot be written."""
    with contextlib.suppress(OSError, RuntimeError, KeyError):
        directory = cache_directory() / "kernels"
        directory.mkdir(parents=True, exist_ok=True)
        if os.access(directory, os.W_OK):
            return directory
    return Path(tempfile.mkdtemp(prefix="optiplug-kernels-"))


def _load_or_build(
    source: str, compiler: tuple[str, str], flags: tuple[str, ...], target: Path
) -> ctypes.CDLL:
    """Load ``target``, building it first when it is missing or cannot be loaded."""
    if target.exists():
        with contextlib.suppress(OSError):  # a damaged file: built again below
            return ctypes.CDLL(str(target))
    _build(source, compiler[0], flags, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as error:
        raise NativeBuildError(f"built {target.name} but could not load it: {error}") from error


def _build(source: str, compiler: str, flags: tuple[str, ...], target: Path) -> None:
    """Compile ``source`` into ``target`` through a temporary file beside it, renamed when whole."""
    with tempfile.TemporaryDirectory(prefix="optiplug-build-") as work:
        source_file = Path(work) / "kernel.c"
        source_file.write_text(source, encoding="utf-8")
        handle, partial = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        os.close(handle)
        try:
            code, said = _compile([compiler, *flags, "-o", partial, str(source_file)], partial)
            if code != 0:
                raise NativeBuildError(
                    f"flags {' '.join(flags)}: exited {code}: {said or 'no output'}"
                )
            if os.path.getsize(partial) == 0:
                raise NativeBuildError(f"flags {' '.join(flags)}: exited 0 but wrote nothing")
            os.replace(partial, target)
        except (OSError, subprocess.SubprocessError) as error:
            raise NativeBuildError(f"flags {' '.join(flags)}: {error}") from error
        finally:
            with contextlib.suppress(OSError):
                os.unlink(partial)


_RUNNING: dict[subprocess.Popen[str], str] = {}
"""The compilers running now, with the partial file each writes (stopped at exit)."""


def _compile(command: list[str], partial: str) -> tuple[int, str]:
    """Run the compiler: its exit code and the first lines it said (killed after the timeout)."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    with _BUILDS_LOCK:
        _RUNNING[process] = partial
    try:
        output, _ = process.communicate(timeout=_BUILD_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return -9, f"took over {_BUILD_SECONDS:.0f} s"
    finally:
        with _BUILDS_LOCK:
            _RUNNING.pop(process, None)
    return process.returncode, " ".join(output.strip().splitlines()[:3])


@atexit.register
def _stop_running_builds() -> None:
    """Stop the compilers still running at exit and remove their partial files.

    A background build must not outlive the process (its thread is a daemon);
    the next process that needs the library builds it again.
    """
    with _BUILDS_LOCK:
        running = list(_RUNNING.items())
    for process, partial in running:
        with contextlib.suppress(OSError):
            process.kill()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            process.wait(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(partial)
