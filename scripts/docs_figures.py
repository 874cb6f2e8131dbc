"""Write measured output into the pages that quote it, so no figure is typed twice by hand.

A page marks a quoted block with two HTML comments (invisible in the rendered page):

    <!-- figures:demo-summary -->
    ```text
    ...
    ```
    <!-- /figures:demo-summary -->

and ``python scripts/docs_figures.py --block demo-summary=FILE`` replaces what is between them, in
README.md and every page under docs/ that carries the marker, with FILE's text as a ``text``
code block. Blocks in use:

- ``demo-summary``: ``make demo``'s summary, as the pipeline writes it beside ``summary.json``
  (``runs/pipeline/pipelines/demo-*/summary.txt``, right after the run that trained: a rerun
  rewrites it with every stage skipped; the README and docs/results/demo.md).
- ``demo-wall``: one line, how long the fresh clone's ``time make demo`` took and where.
- ``bench-NAME``: a benchmark's ``RESULT:`` line (``python bench/NAME.py | grep RESULT``).

Exits 2 with one line, writing nothing, when a block is marked nowhere, a marker is unpaired or
a file is missing; pages are written atomically.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class FiguresError(Exception):
    """A one-line reason nothing was written."""


def pages(root: Path) -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    found = [root / "README.md"] if (root / "README.md").is_file() else []
    return found + sorted((root / "docs").rglob("*.md"))


def fill(text: str, name: str, body: str, path: Path) -> str:
    """``text`` with every ``name`` block replaced by ``body`` as a code block."""
    start, end = f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->"
    if text.count(start) != text.count(end):
        raise FiguresError(f"{path}: {text.count(start)} '{start}' but {text.count(end)} '{end}'")
    block = f"{start}\n```text\n{body.rstrip()}\n```\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    return pattern.sub(lambda _: block, text)


def update(root: Path, blocks: dict[str, str]) -> list[Path]:
    """Fill ``blocks`` (name -> text) in the pages under ``root``; returns the pages changed.
    Raises ``FiguresError`` before writing anything when a block is marked nowhere."""
    texts = {path: path.read_text() for path in pages(root)}
    new = dict(texts)
    for name, body in blocks.items():
        marked = [p for p, t in new.items() if f"<!-- figures:{name} -->" in t]
        if not marked:
            raise FiguresError(
                f"block {name!r} is marked in no page under {root}; add "
                f"'<!-- figures:{name} -->' and '<!-- /figures:{name} -->' where it goes"
            )
        for path in marked:
            new[path] = fill(new[path], name, body, path)
    changed = [p for p in new if new[p] != texts[p]]
    for path in changed:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as tmp:
            tmp.write(new[path])
        os.replace(tmp.name, path)
    return changed


def parse_block(spec: str) -> tuple[str, str]:
    name, sep, file = spec.partition("=")
    if not sep or not NAME.match(name):
        raise FiguresError(f"--block {spec!r}: use NAME=FILE, NAME in lowercase letters and '-'")
    path = Path(file)
    if not path.is_file():
        raise FiguresError(f"--block {name}: {path} not found")
    return name, path.read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", action="append", default=[], metavar="NAME=FILE",
                        help="fill the block NAME with FILE's text (repeat)")  # fmt: skip
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout (README.md, docs/)")
    args = parser.parse_args(argv)
    try:
        blocks = dict(parse_block(spec) for spec in args.block)
        changed = update(args.root, blocks)
    except FiguresError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"updated {path.relative_to(args.root)}")
    if not changed:
        print("every block already up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
