"""Every page reads as documentation for a reader: it opens by saying what it covers, and it
carries no notes about how the work was organised (tracker issue numbers, machine loans)."""

from __future__ import annotations

import re

import pytest

from tests.docs.pages import DOCS_PAGES, PAGES, page_id

# A tracker reference ("issue 17", "Issue 5's targets") means nothing to a reader of the page.
ISSUE_NUMBER = re.compile(r"issue [0-9]", flags=re.I)


@pytest.mark.parametrize("page", PAGES[1:], ids=page_id)
def test_each_docs_page_opens_with_what_it_covers(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{page_id(page)} has no title"
    first = next(line for line in lines[1:] if line.strip())
    assert first.startswith("This page covers "), f"{page_id(page)} opens with {first!r}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_page_cites_issue_numbers(page):
    hits = [f"line {number}: {line.strip()}"
            for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1)
            if ISSUE_NUMBER.search(line)]
    assert not hits, f"{page_id(page)} cites tracker issues:\n" + "\n".join(hits)


# The reference pages of docs/ (not the generated side-by-side page, nor the dated runs of
# docs/results/): each short enough to read at once, together a reference, not a log.
PAGE_LIMIT = 15_000  # bytes
REFERENCE_LIMIT = 120_000  # bytes, all reference pages together
GENERATED = {"side-by-side.md"}


def reference_sizes() -> dict[str, int]:
    return {page.name: len(page.read_bytes()) for page in DOCS_PAGES if page.name not in GENERATED}


def test_each_reference_page_is_within_its_budget():
    over = {name: size for name, size in reference_sizes().items() if size > PAGE_LIMIT}
    assert not over, f"docs pages over {PAGE_LIMIT:,} bytes (move dated numbers to docs/results/): {over}"


def test_the_reference_pages_together_are_within_their_budget():
    sizes = reference_sizes()
    assert len(sizes) >= 10, f"found only {sorted(sizes)}"
    total = sum(sizes.values())
    assert total <= REFERENCE_LIMIT, (
        f"docs reference pages hold {total:,} bytes, over {REFERENCE_LIMIT:,}: "
        + ", ".join(f"{name} {size:,}" for name, size in sorted(sizes.items(), key=lambda item: -item[1])))
