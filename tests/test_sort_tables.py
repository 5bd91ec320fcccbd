"""docs/js/sort-tables.js, the leaderboard page's table sorting, run under node on a small DOM."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "js" / "sort-tables.js"

# A table of two columns with just the DOM the script touches; each click prints the column.
HARNESS = """
function cell(t) { return { textContent: t, attrs: {}, style: {},
  setAttribute(k, v) { this.attrs[k] = v; }, getAttribute(k) { return this.attrs[k] || null; },
  removeAttribute(k) { delete this.attrs[k]; }, addEventListener(e, f) { this.click = f; } }; }
var data = [["b", "2 ± 0.1"], ["a", "-"], ["c", "10"], ["d", "1,500"]];
var body = { rows: data.map(r => ({ cells: r.map(cell) })),
  appendChild(row) { this.rows.splice(this.rows.indexOf(row), 1); this.rows.push(row); } };
var head = { rows: [{ cells: [cell("name"), cell("steps")] }] };
var table = { tHead: head, tBodies: [body] };
global.document = { readyState: "complete", querySelectorAll() { return [table]; } };
require(process.argv[2]);
function show(c) { console.log(body.rows.map(r => r.cells[c].textContent).join("|")); }
head.rows[0].cells[1].click(); show(1);
head.rows[0].cells[1].click(); show(1);
head.rows[0].cells[0].click(); show(0);
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_headings_sort_numbers_then_words_and_reverse(tmp_path: Path) -> None:
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS, encoding="utf-8")
    node = shutil.which("node")
    assert node is not None
    done = subprocess.run(
        [node, str(harness), str(SCRIPT)], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.splitlines() == [
        "2 ± 0.1|10|1,500|-",  # numbers ascending (an interval by its mean), "-" last
        "1,500|10|2 ± 0.1|-",  # the second click reverses them; "-" stays last
        "a|b|c|d",  # words alphabetically
    ]
