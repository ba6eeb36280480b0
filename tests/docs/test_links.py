"""Links cannot go stale: on every page (README.md, docs/, docs/results/) a link whose text is a
code span and whose target is a ``.py`` file names a symbol that file defines; every relative
link reaches a file or folder, and every ``#anchor`` a heading of the page it points into. The
README links every page of docs/, and the benchmarks page lists every run log of docs/results/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.pages import (
    DOCS,
    DOCS_PAGES,
    LINK,
    PAGES,
    README_PAGE,
    RESULT_PAGES,
    RESULTS_INDEX,
    ROOT,
    anchors,
    defined_names,
    links,
    page_id,
    prose,
    section,
)


def symbol_links() -> list[tuple[Path, str, str]]:
    """(page, symbol, target) for every [`symbol`](file.py) link; a file name is no symbol."""
    return sorted({(page, symbol, target) for page in PAGES for symbol, target in LINK.findall(prose(page))
                   if not symbol.endswith(".py")})


SYMBOL_LINKS = symbol_links()
CONCEPT_LINKS = sorted(set(LINK.findall(section("Concept map"))))


@pytest.mark.parametrize(("page", "symbol", "target"), SYMBOL_LINKS,
                         ids=[f"{page_id(page)}->{target}::{symbol}"
                              for page, symbol, target in SYMBOL_LINKS])
def test_symbol_links_name_symbols_that_exist(page, symbol, target):
    file = (page.parent / target).resolve()
    where = f"{page_id(page)} links {symbol} in {target}"
    assert file.is_file(), f"{where}, which does not exist"
    assert symbol in defined_names(file), f"{where}, which defines no {symbol}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_reach_files_and_headings(page):
    broken = []
    for text, target in links(page):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"[{text}]({target}): no such file")
            continue
        shown = re.fullmatch(r"`([\w./-]+/[\w./-]*)`", text)  # [`dir/file`](...): text is the target
        if shown and file != (ROOT / shown.group(1)).resolve():
            broken.append(f"[{text}]({target}): the text names another path")
        if anchor and (file.suffix != ".md" or anchor not in anchors(file)):
            broken.append(f"[{text}]({target}): no heading '#{anchor}' in {file.name}")
    assert not broken, f"{page_id(page)}:\n" + "\n".join(broken)


def test_links_were_found():
    """The link checks above are not vacuous: the pages link files, symbols and headings."""
    all_links = [target for page in PAGES for _, target in links(page)]
    assert len(all_links) > 100
    assert any(target.startswith("#") for target in all_links)
    assert any(target.startswith("docs/") for target in all_links)
    assert any(target.startswith("../") for target in all_links)
    assert len(SYMBOL_LINKS) > len(CONCEPT_LINKS)


def test_readme_links_every_docs_page():
    linked = {target.partition("#")[0] for _, target in links(README_PAGE)}
    for page in DOCS_PAGES:
        assert f"docs/{page.name}" in linked, f"README does not link docs/{page.name}"


def test_past_runs_list_every_results_page():
    """Every run log of docs/results/ is listed in the folder's index, which the benchmarks
    page's Past runs links."""
    assert RESULT_PAGES, "docs/results/ holds no run log"
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", section("Runs", RESULTS_INDEX)))
    assert listed == {page.name for page in RESULT_PAGES if page != RESULTS_INDEX}
    assert "(results/README.md)" in section("Past runs", DOCS / "benchmarks.md")
