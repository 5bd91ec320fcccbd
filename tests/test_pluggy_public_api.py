"""The core calls pluggy through its public API only.

Hooks are called with ``pm.hook.<name>(...)`` and ``HookCaller.call_extra``,
in managers the registry builds; nothing reaches into pluggy's private
attributes, replaces a ``HookImpl``'s function or reads stack frames to
find which plugin raised.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "core" / "src" / "optiplug"

PRIVATE = re.compile(
    r"\._hookexec|\._hookimpls|\._inner_hookexec|\._multicall|_call_history|\._manager\._"
    r"|\._name2plugin|\._plugin_distinfo|impl\.function\s*=|\.function\s*=[^=]"
)
"""pluggy's private attributes, and patching an implementation's function."""

FRAMES = re.compile(r"sys\._getframe|tb_frame|f_back|inspect\.currentframe|inspect\.stack\(")
"""Reading stack frames (allowed elsewhere in the core, e.g. for warnings' stack levels)."""


def _sources(pluggy_only: bool = False) -> list[Path]:
    found = sorted(CORE.rglob("*.py"))
    assert len(found) > 50, f"expected the core's sources under {CORE}"
    if pluggy_only:
        found = [p for p in found if re.search(r"^\s*(import|from) pluggy", _text(p), re.M)]
        assert {p.name for p in found} >= {"registry.py", "hookcalls.py"}
    return found


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _matches(paths: list[Path], pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(CORE)}:{number}: {line.strip()}"
        for path in paths
        for number, line in enumerate(_text(path).splitlines(), 1)
        if pattern.search(line)
    ]


def test_the_core_uses_no_private_pluggy_attribute() -> None:
    assert _matches(_sources(), PRIVATE) == []


def test_the_modules_calling_pluggy_scan_no_frame_and_ignore_no_type() -> None:
    assert _matches(_sources(pluggy_only=True), FRAMES) == []
    assert _matches(_sources(pluggy_only=True), re.compile("type: ignore")) == []


@pytest.mark.parametrize(
    "line",
    [
        "returned = self._manager._hookexec(name, impls, {}, False)",
        "impl.function = guarded(impl.function, name)",
        "codes.get(trace.tb_frame.f_code)",
        "for impl in hook._hookimpls:",
    ],
)
def test_the_patterns_catch_what_they_forbid(line: str) -> None:
    assert PRIVATE.search(line) or FRAMES.search(line)
