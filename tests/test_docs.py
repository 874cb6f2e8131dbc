"""The documentation site: `mkdocs build --strict`, every internal link and anchor of the built
HTML, the spec citations, and the home page and an API page rendered in headless Chromium."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from tests.chromium import CHROMIUM_MISSING, browser, chromium_path, serve_directory

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if value and (name == "href" and tag in ("a", "link") or name == "src"):
                self.links.append(value)


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def _target(site: Path, page: Path, link: str) -> tuple[Path, str] | None:
    """The file and fragment an internal link points at; None for an external one."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
        return None
    base = "/" + page.relative_to(site).as_posix()
    resolved = urlsplit(urljoin(base, link))
    path = site / unquote(resolved.path).lstrip("/")
    if resolved.path.endswith("/") or path.is_dir():
        path = path / "index.html"
    return path, unquote(resolved.fragment)


def broken_links(site: Path) -> list[str]:
    """``page -> link (why)`` for every internal link to a missing file or anchor."""
    pages = {p: _parse(p) for p in sorted(site.rglob("*.html"))}
    broken = []
    for page, parsed in pages.items():
        for link in parsed.links:
            target = _target(site, page, link)
            if target is None:
                continue
            path, fragment = target
            where = f"{page.relative_to(site)} -> {link}"
            if not path.is_file():
                broken.append(f"{where} (no file)")
            elif fragment and path.suffix == ".html":
                ids = pages[path].ids if path in pages else _parse(path).ids
                if fragment not in ids:
                    broken.append(f"{where} (no anchor)")
    return broken


def test_build_strict_writes_every_nav_page(site):
    for page in [
        "index.html",
        "spec/index.html",
        "guide/own-dataset/index.html",
        "reference/configuration/index.html",
        "results/recap-vs-bc/index.html",
        "validity/index.html",
        "api/core/index.html",
    ]:
        assert (site / page).is_file(), page
    api = (site / "api/core/index.html").read_text(encoding="utf-8")
    assert 'id="recap.core.advantages.add_advantages"' in api  # mkdocstrings rendered it


def test_no_internal_link_is_broken(site):
    assert broken_links(site) == []


def test_link_checker_finds_missing_files_and_anchors(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text(
        '<h1 id="top">x</h1><a href="a/">ok</a><a href="#top">ok</a><a href="#gone">bad</a>'
        '<a href="b/">bad</a><a href="https://example.org/x">external</a>'
    )
    (tmp_path / "a" / "index.html").write_text(
        '<a href="../index.html#top">ok</a><a href="../#nope">bad</a><img src="../img.png">'
    )
    assert broken_links(tmp_path) == [
        "a/index.html -> ../#nope (no anchor)",
        "a/index.html -> ../img.png (no file)",
        "index.html -> #gone (no anchor)",
        "index.html -> b/ (no file)",
    ]


def test_spec_citations_name_existing_sections():
    sections = set(re.findall(r"^## (\d+)\. ", (REPO / "docs/spec.md").read_text(), re.M))
    assert sections == {"1", "2", "3", "4", "5", "6", "7"}
    cited = {}
    for path in [*REPO.glob("recap/**/*.py"), *REPO.glob("recap/gin/**/*.gin"), REPO / "README.md"]:
        for number in re.findall(r"spec\.md §(\d+)", path.read_text(encoding="utf-8")):
            cited.setdefault(number, []).append(path.relative_to(REPO).as_posix())
    assert cited, "no docs/spec.md citation found"
    assert {n: paths for n, paths in cited.items() if n not in sections} == {}


@pytest.mark.skipif(chromium_path() is None, reason=CHROMIUM_MISSING)
def test_home_and_api_pages_render_in_chromium(site):
    with serve_directory(site) as base, browser() as page:
        page.goto(base)
        page.wait_for("document.querySelector('h1') !== null")
        assert page.evaluate("document.querySelector('h1').firstChild.textContent") == "recap"
        assert page.evaluate("document.title").startswith("recap")
        text = page.text()
        assert "Your own LeRobot dataset on 8 devices" in text  # the nav, rendered
        assert "recap-pipeline" in text  # the step table
        # Material's JavaScript ran: the search box is wired up.
        page.wait_for("document.querySelector('.md-search__input') !== null")

        page.goto(base + "api/core/")
        heading = page.wait_for(
            "(document.getElementById('recap.core.advantages.add_advantages') || {}).innerText"
        )
        assert "add_advantages" in heading
        assert "recap.core.returns" in page.text()
        assert page.exceptions == []


def test_readme_is_short_and_its_relative_links_exist():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    relative = [link for link in links if not urlsplit(link).scheme]
    assert "docs/spec.md" in relative and "docs/guide/own-dataset.md" in relative
    assert [link for link in relative if not (REPO / link).exists()] == []


def test_readme_headline_figure_is_the_benchmarks_result_line():
    """The README's RECAP-vs-BC figure is the one `bench/recap_vs_bc.py`'s RESULT line gave
    (copied to the results page verbatim), not a second hand-typed number."""
    page = (REPO / "docs/results/recap-vs-bc.md").read_text(encoding="utf-8")
    line = next(ln for ln in page.splitlines() if ln.startswith("RESULT:") and "sft_rlinf_ci" in ln)
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    low, high = fields["sft_rlinf_ci"].strip("[]").split(",")
    figure = f"+{float(fields['sft_rlinf_b1_minus_bc']):.3f} [{low}, {high}]"
    assert figure == "+0.134 [+0.024, +0.255]"
    assert (fields["seeds"], fields["episodes"]) == ("5", "200")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"**{figure}**" in readme
    assert "**5 training seeds x 200 held-out episodes**" in readme
