"""The index of docs/results/ is grouped by topic and, within a topic, in the date order its
intro promises; each entry's date is its page's; every file there is named machine-topic-detail
in lower case and hyphens, and every raw report is linked from a page.

Which page each entry lists, and that every page is listed once, is test_links.py's
``test_past_runs_list_every_results_page``.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.pages import DOCS, RESULTS, RESULTS_INDEX, links, section

DAY = r"\d{4}-\d{2}-\d{2}"
# "(2026-11-30)", "(2026-11-30 and 2026-12-01)", "(2026-11-30 to 2026-12-02)"
DATES = re.compile(rf"\(({DAY})(?: (?:and|to) ({DAY}))?\)")
NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*\.(md|json|png)")
# a word of three or more letters then a digit reads as a numbered variant (idle2, busy2p):
# spell out what differs instead. f32, bf16, h200, 8x128 and 1thread are not such words.
NUMBERED_VARIANT = re.compile(r"(?:^|-)[a-z]{3,}\d")


def dates(text: str) -> tuple[str, str]:
    """(first, last) day of the first parenthesised date or span in ``text``."""
    match = DATES.search(text)
    assert match, f"no (YYYY-MM-DD) date in: {text[:80]!r}"
    first, last = match.groups()
    return first, last or first


def topics() -> list[tuple[str, list[tuple[str, str]]]]:
    """(topic, [(page, entry text), ...]) for each ### heading of the index's Runs section."""
    runs = section("Runs", RESULTS_INDEX)
    before, *parts = re.split(r"^### (.+)\n", runs, flags=re.M)
    assert not before.strip(), f"Runs lists entries before its first topic: {before.strip()[:80]!r}"
    grouped = []
    for title, body in zip(parts[::2], parts[1::2], strict=True):
        entries = [re.sub(r"\s+", " ", item) for item in re.split(r"^- ", body, flags=re.M)[1:]]
        pages = [re.match(r"\[[^\]]*\]\(([\w.-]+\.md)\)", entry) for entry in entries]
        assert all(pages), f"an entry under '{title}' does not start with its page's link"
        grouped.append((title, [(page.group(1), entry) for page, entry in zip(pages, entries, strict=True)]))
    return grouped


def promised_order() -> str:
    intro = RESULTS_INDEX.read_text(encoding="utf-8").split("\n## ", 1)[0]
    orders = [order for order in ("oldest first", "newest first") if order in intro]
    assert len(orders) == 1, "the index's intro says neither 'oldest first' nor 'newest first'"
    return orders[0]


def test_index_is_grouped_by_topic():
    grouped = topics()
    titles = [title for title, _ in grouped]
    assert len(titles) >= 3, f"the index has {len(titles)} topic(s): {titles}"
    assert len(set(titles)) == len(titles), f"a topic heading repeats: {titles}"
    for title, entries in grouped:
        assert entries, f"topic '{title}' lists no run"
    pages = [page for _, entries in grouped for page, _ in entries]
    assert len(set(pages)) == len(pages), "a page is listed under more than one topic"


def test_each_topic_is_in_the_promised_date_order():
    newest_first = promised_order() == "newest first"
    for title, entries in topics():
        days = [dates(entry) for _, entry in entries]
        expected = sorted(days, reverse=newest_first)
        assert days == expected, (
            f"topic '{title}' is not {promised_order()}: "
            + ", ".join(f"{page} {first}" for (page, _), (first, _) in zip(entries, days, strict=True)))


def test_each_entry_dates_its_page():
    """An entry's date or span is the one in its page's title."""
    for _, entries in topics():
        for page, entry in entries:
            title = (RESULTS / page).read_text(encoding="utf-8").splitlines()[0]
            assert dates(entry) == dates(title), f"{page}: the index says {dates(entry)}, its title {title!r}"


def test_results_files_are_named_in_lower_case_and_hyphens():
    bad = [path.name for path in sorted(RESULTS.iterdir())
           if path != RESULTS_INDEX
           and not (NAME.fullmatch(path.name) and not NUMBERED_VARIANT.search(path.stem))]
    assert not bad, ("docs/results/ names should read machine-topic-detail, lower case and "
                     f"hyphens, no numbered variants like 'idle2p': {bad}")


def test_every_raw_report_is_linked_from_a_page():
    linked: set[Path] = set()
    for page in [*sorted(DOCS.glob("*.md")), *sorted(RESULTS.glob("*.md"))]:
        linked.update((page.parent / target.partition("#")[0]).resolve()
                      for _, target in links(page) if target.partition("#")[0].endswith(".json"))
    orphans = [path.name for path in sorted(RESULTS.glob("*.json")) if path.resolve() not in linked]
    assert not orphans, f"raw reports no page links: {orphans}"
