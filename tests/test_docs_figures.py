"""scripts/docs_figures.py: measured output written into the pages that quote it."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.helpers import REPO

SPEC = importlib.util.spec_from_file_location("docs_figures", REPO / "scripts" / "docs_figures.py")
figures = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(figures)

PAGE = """# Demo
Before.
<!-- figures:demo-summary -->
```text
old summary
```
<!-- /figures:demo-summary -->
After.
"""


def checkout(tmp_path, readme: str = PAGE, page: str = PAGE):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "docs" / "results" / "demo.md").write_text(page)
    (tmp_path / "docs" / "index.md").write_text("# Home\n")
    return tmp_path


def test_a_block_is_written_into_every_page_that_marks_it(tmp_path, capsys):
    root = checkout(tmp_path)
    (tmp_path / "summary.txt").write_text("pipeline 'demo': RECAP 0.3 vs BC 0.2\nstep  status\n")
    argv = ["--root", str(root), "--block", f"demo-summary={tmp_path / 'summary.txt'}"]
    assert figures.main(argv) == 0
    expected = PAGE.replace("old summary", "pipeline 'demo': RECAP 0.3 vs BC 0.2\nstep  status")
    assert (root / "README.md").read_text() == expected
    assert (root / "docs" / "results" / "demo.md").read_text() == expected
    assert (root / "docs" / "index.md").read_text() == "# Home\n"
    assert capsys.readouterr().out == "updated README.md\nupdated docs/results/demo.md\n"
    assert figures.main(argv) == 0  # idempotent
    assert capsys.readouterr().out == "every block already up to date\n"


@pytest.mark.parametrize(
    "readme, block, line",
    [
        (PAGE, "bench-returns", "block 'bench-returns' is marked in no page under {root}; add "
         "'<!-- figures:bench-returns -->' and '<!-- /figures:bench-returns -->' where it goes"),
        (PAGE.replace("<!-- /figures:demo-summary -->\n", ""), "demo-summary",
         "{root}/README.md: 1 '<!-- figures:demo-summary -->' but 0 "
         "'<!-- /figures:demo-summary -->'"),
        (PAGE, "Demo Summary", "--block 'Demo Summary={file}': use NAME=FILE, NAME in lowercase "
         "letters and '-'"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, capsys, readme, block, line):
    root = checkout(tmp_path, readme=readme)
    file = tmp_path / "result.txt"
    file.write_text("RESULT: x=1\n")
    before = {p: p.read_text() for p in root.rglob("*.md")}
    assert figures.main(["--root", str(root), "--block", f"{block}={file}"]) == 2
    assert capsys.readouterr().err == f"error: {line.format(root=root, file=file)}\n"
    assert {p: p.read_text() for p in root.rglob("*.md")} == before


def test_the_repository_quotes_one_demo_summary_everywhere():
    """The README and the demo's results page carry the same block (the script wrote both)."""
    start, end = "<!-- figures:demo-summary -->\n", "<!-- /figures:demo-summary -->"
    pattern = re.compile(re.escape(start) + "(.*?)" + re.escape(end), re.S)
    quoted = {p.name: pattern.findall(p.read_text()) for p in figures.pages(REPO)}
    blocks = {b for found in quoted.values() for b in found}
    assert len(blocks) == 1 and {n for n, found in quoted.items() if found} >= {
        "README.md", "demo.md"}  # fmt: skip
    (block,) = blocks
    assert block.startswith("```text\npipeline 'demo': value eval Spearman ")
