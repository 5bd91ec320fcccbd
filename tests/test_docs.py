"""The Python examples in README.md and docs/*.md run as written.

Each file's ```python blocks run in order in one namespace (a block may use
what an earlier block of the same file defined). A block whose first line is
``# not run`` is skipped (e.g. a plugin module that only makes sense inside
its own distribution).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[str]:
    blocks = BLOCK.findall(path.read_text(encoding="utf-8"))
    return [block for block in blocks if not block.startswith("# not run")]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(document: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples that write files write here
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for index, block in enumerate(python_blocks(document)):
        code = compile(block, f"{document.name}[block {index}]", "exec")
        exec(code, namespace)


def test_readme_quickstart_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    quickstart = readme.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    install, test = quickstart.strip().splitlines()
    assert install.endswith("&& optiplug list") or "optiplug train" in install
    assert test in ci.splitlines()
