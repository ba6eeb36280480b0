"""The side-by-side pages (docs/side-by-side.html and .md) cannot go stale or lie: they are what
``python -m scripts.side_by_side`` writes now; they hold every concept of the README's concept
map and every symbol it names; each code block is ``inspect.getsource`` of a symbol the map
names, shown once per column (a method the map also names inside its class's block), under the
first concept that names it, with exactly the concepts it covers; every later mention links to
it; the code marks the lines that carry its style and links the line of its definition. In a
real browser (slow) the three columns stand side by side at a desktop width, nothing overflows,
every block shows."""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import itertools
import json
import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pygments
import pytest

from scripts import side_by_side
from tests.docs.pages import DOCS, LINK, ROOT, anchors, section, slug

HTML_PAGE = DOCS / "side-by-side.html"
MARKDOWN_PAGE = DOCS / "side-by-side.md"
COLUMNS = ("explicit", "einsum", "mathfirst", "torch reference")  # the concept map's, in order
# A line that makes a style's call, written independently of the script's ast walk.
STYLE_LINE = {"explicit": re.compile(r"\.(view|transpose)\("), "einsum": re.compile(r"\beinsum\("),
              "mathfirst": re.compile(r"\b(einsum|rearrange)\(")}
ATTENTION_ROWS = ("scaled dot-product attention", "head split and merge")
REGENERATE = "run `python -m scripts.side_by_side` and commit both pages"


def map_rows() -> list[list[str]]:
    """The concept map's body rows, split into cells, as tests/docs reads them."""
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in section("Concept map").splitlines()
            if line.startswith("| ") and not line.startswith("| concept")]


def plain(markdown: str) -> str:
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown).replace("`", "")


# ---------------------------------------------------------------- reading the pages back

def html_sections(page: str) -> dict[str, str]:
    """{section id: its HTML} for each concept's section, in page order."""
    found = re.findall(r'<section class="concept" id="([^"]+)">(.*?)</section>', page, flags=re.S)
    return dict(found)


def html_blocks(section_html: str) -> list[dict]:
    """Each entry of a section, in order: a code block (its column, id, symbol, link, covered
    concepts, code text and marked lines) or a one-line mention (its column, symbol, link and the
    #anchor it points to)."""
    entries = []
    for column, body in re.findall(r'<div class="(?:column|reference)" data-column="([^"]+)">(.*?)'
                                   r'(?=<div class="(?:column|reference)" data-column=|\Z)',
                                   section_html, flags=re.S):
        starts = list(re.finditer(r'<div class="block( shown)?"(?: id="([^"]+)")?>', body))
        ends = [start.start() for start in starts[1:]] + [len(body)] * bool(starts)
        for start, end in zip(starts, ends, strict=True):
            block = body[start.start():end]
            name, href, text = re.search(r'<p class="where"><code>([^<]+)</code> · '
                                         r'<a class="source" [^>]*href="([^"]+)">([^<]+)</a>', block).groups()
            entry = {"column": html.unescape(column), "symbol": name, "href": href, "text": text}
            if start.group(1):
                entry["kind"] = "mention"
                entry["target"] = re.search(r'<a class="shown" href="#([^"]+)">', block)[1]
                entries.append(entry)
                continue
            pre = re.search(r"<pre>(.*?)</pre>", block, flags=re.S)[1]
            lines = re.findall(r'<span id="([^"]+)">(.*?)\n</span>', pre, flags=re.S)
            numbers = [int(html.unescape(re.search(r'<span class="linenos">\s*(\d+)</span>', line)[1]))
                       for _, line in lines]
            code = "".join(html.unescape(re.sub(r"<[^>]+>", "", re.sub(
                r'<span class="linenos">[^<]*</span>', "", line))) + "\n" for _, line in lines)
            marked = [number for number, (_, line) in zip(numbers, lines, strict=True)
                      if 'class="hll"' in line]
            covers = re.search(r'<p class="covers">covers: (.*?)</p>', block)[1]
            entry.update(kind="code", id=start.group(2), code=code, numbers=numbers, marked=marked,
                         line_ids=dict(zip(numbers, (line_id for line_id, _ in lines), strict=True)),
                         covers=[(target, html.unescape(title)) for target, title in
                                 re.findall(r'<a href="#([^"]+)">([^<]+)</a>', covers)])
            entries.append(entry)
    return entries


def markdown_sections(page: str) -> dict[str, str]:
    """{heading: its text} for each level-2 section of the Markdown page."""
    return dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", page, flags=re.M | re.S))


MARKDOWN_CODE = re.compile(r"^### (?P<heading>.+?)\n\n"
                           r"`(?P<symbol>[\w.]+)` at \[(?P<text>[^\]]+)\]\((?P<href>[^)]+)\)"
                           r"; covers (?P<covers>(?:\[[^\]]+\]\(#[^)]+\)(?:, )?)+).*?:\n\n"
                           r"```python\n(?P<code>.*?)```$", flags=re.M | re.S)
MARKDOWN_MENTION = re.compile(r"^`(?P<symbol>[\w.]+)` at \[(?P<text>[^\]]+)\]\((?P<href>[^)]+)\): "
                              r"\[[^\]]+\]\(#(?P<target>[^)]+)\)\.$", flags=re.M)


def markdown_blocks(section_text: str) -> list[dict]:
    """Each entry of a section, in order: a code block under its heading (its anchor, symbol,
    file:line link, covered concepts and code) or a one-line mention (its symbol, link, target)."""
    found = [(m.start(), {"kind": "code", "heading": m["heading"], "symbol": m["symbol"], "text": m["text"],
                          "href": m["href"], "code": m["code"],
                          "covers": [(target, title) for title, target in
                                     re.findall(r"\[([^\]]+)\]\(#([^)]+)\)", m["covers"])]})
             for m in MARKDOWN_CODE.finditer(section_text)]
    found += [(m.start(), {"kind": "mention", **m.groupdict()})
              for m in MARKDOWN_MENTION.finditer(section_text)]
    return [entry for _, entry in sorted(found, key=lambda item: item[0])]


def live_object(path: str, symbol: str):
    """The object ``symbol`` names in the module at ``path``, and the object that holds it."""
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    holder, obj = None, module
    for part in symbol.split("."):
        holder, obj = obj, getattr(obj, part)
    return module, holder, obj


def expected_source(path: str, symbol: str) -> str:
    """``inspect.getsource`` of the symbol; for a class attribute, which it cannot give, the
    statement that assigns it, checked to rebuild the live value."""
    module, holder, obj = live_object(path, symbol)
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj):
        return inspect.getsource(obj)
    owner = inspect.getsource(holder).splitlines(keepends=True)
    name = symbol.rsplit(".", 1)[-1]
    start = next(i for i, line in enumerate(owner) if re.match(rf"\s+{name}\s*[:=]", line))
    for end in range(start + 1, len(owner) + 1):
        statement = "".join(owner[start:end])
        try:
            node = ast.parse(statement.strip()).body[0]
        except SyntaxError:
            continue
        value = eval(compile(ast.Expression(node.value), path, "eval"), vars(module))
        assert value == obj, f"{path}::{symbol}: the assignment does not give the live value"
        return statement
    raise AssertionError(f"{path}::{symbol}: no complete assignment found")


def outermost(column_named: list[tuple[str, str]], symbol: str, path: str) -> str:
    """The symbol whose block shows ``symbol``'s code: the shortest name the column names in the
    same file that is ``symbol`` or a dotted prefix of it (``Class`` for ``Class.method``)."""
    return min((name for name, file in column_named
                if file == path and (symbol == name or symbol.startswith(name + "."))), key=len)


def expected_layout() -> list[list[list[tuple[str, str, str]]]]:
    """Per row of the map, per column, what the pages show, as (kind, symbol, path): a block's code
    the first time the column names it or a symbol in it, then a mention of each named symbol
    that is not that block's own or whose block came before."""
    rows = map_rows()
    named = {column: [] for column in COLUMNS}
    for row in rows:
        for column, cell in zip(COLUMNS, row[1:], strict=True):
            named[column] += [found for found in LINK.findall(cell) if found not in named[column]]
    shown: set[tuple[str, str, str]] = set()
    layout = []
    for row in rows:
        cells = []
        for column, cell in zip(COLUMNS, row[1:], strict=True):
            entries = []
            for symbol, path in LINK.findall(cell):
                outer = outermost(named[column], symbol, path)
                first = (column, outer, path) not in shown
                if first:
                    shown.add((column, outer, path))
                    entries.append(("code", outer, path))
                if not first or symbol != outer:
                    entries.append(("mention", symbol, path))
            cells.append(entries)
        layout.append(cells)
    return layout


def expected_covers(column: str, outer: str, path: str) -> list[str]:
    """The concepts whose cell in ``column`` names ``outer`` or a symbol in it, in the map's order."""
    return [plain(row[0]) for row in map_rows()
            if any(file == path and (symbol == outer or symbol.startswith(outer + "."))
                   for symbol, file in LINK.findall(row[1 + COLUMNS.index(column)]))]


@pytest.fixture(scope="module")
def page() -> str:
    return HTML_PAGE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def markdown() -> str:
    return MARKDOWN_PAGE.read_text(encoding="utf-8")


# ---------------------------------------------------------------- the tests

class Meaning(HTMLParser):
    """What a page says, whichever Pygments release wrote it: its elements with their attributes
    and text, character references read (one release writes ``&quot;`` where another writes
    ``"``), Pygments' own token spans and style sheet left out (a release may colour a token
    differently), the project's marks kept (marked lines, line numbers, line ids)."""

    OWN_SPANS = frozenset({"hll", "linenos", "legend", "from"})

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.items: list[tuple] = []
        self.spans: list[bool] = []  # per open <span>: is it one of Pygments' token spans?
        self.in_style = False

    def handle_starttag(self, tag, attrs):
        if tag == "span":
            token = len(attrs) == 1 and attrs[0][0] == "class" and attrs[0][1] not in self.OWN_SPANS
            self.spans.append(token)
            if token:
                return
        self.in_style = tag == "style"
        self.items.append(("<", tag, tuple(sorted(attrs))))

    def handle_endtag(self, tag):
        if tag == "span" and self.spans.pop():
            return
        self.in_style = False
        self.items.append((">", tag))

    def handle_data(self, data):
        if self.in_style:
            data = "project style sheet" if side_by_side.CSS.strip() in data else "other style sheet"
        if self.items and self.items[-1][0] == "text":
            self.items[-1] = ("text", self.items[-1][1] + data)
        else:
            self.items.append(("text", data))


def meaning(page: str) -> list[tuple]:
    reader = Meaning()
    reader.feed(page)
    reader.close()
    return reader.items


def test_reading_a_page_ignores_pygments_escaping_and_token_classes_only():
    """The staleness test's lens, checked on hand-written pages: two releases' spellings of one
    page read the same; a changed word, line number or mark does not."""
    old = ('<pre><span class="linenos">7</span><span class="n">f</span><span class="p">(</span>'
           '<span class="s2">&quot;a&quot;</span>)\n</pre><style>x{}\n' + side_by_side.CSS + '</style>')
    new = ('<pre><span class="linenos">7</span><span class="nf">f</span>(<span class="s">"a"</span>)'
           '\n</pre><style>y{}\n' + side_by_side.CSS + '</style>')
    assert meaning(old) == meaning(new)
    for edited in (old.replace("&quot;a", "&quot;b"), old.replace(">7<", ">8<"),
                   old.replace('class="linenos"', 'class="hll"'), old.replace(side_by_side.CSS, "")):
        assert meaning(edited) != meaning(old), edited


def test_committed_pages_are_what_the_command_writes():
    """Edit a variant, the concept map or the script, and the committed pages are stale. The HTML
    page is compared by what it says (``meaning``), not byte for byte: Pygments releases escape
    quotes and name tokens differently, and the page must not go stale when Pygments moves."""
    for path, text in side_by_side.pages().items():
        committed = (ROOT / path).read_text(encoding="utf-8")
        same = meaning(committed) == meaning(text) if path.suffix == ".html" else committed == text
        assert same, (f"{path} is not what the command writes now (with Pygments "
                      f"{pygments.__version__}): {REGENERATE}")


def test_pages_carry_no_machine_paths_or_times(page, markdown):
    for text in (page, markdown):
        assert str(ROOT) not in text and "file://" not in text and "/home/" not in text
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b|\b\d\d:\d\d:\d\d\b", text), "a date or time"


def test_every_concept_of_the_map_has_a_section_in_order(page, markdown):
    concepts = [row[0] for row in map_rows()]
    assert len(concepts) >= 15
    assert list(html_sections(page)) == [slug(concept) for concept in concepts]
    assert list(markdown_sections(markdown)) == [plain(concept) for concept in concepts]
    for concept, section_html in zip(concepts, html_sections(page).values(), strict=True):
        columns = re.findall(r'data-column="([^"]+)"', section_html)
        assert columns == list(COLUMNS), f"{concept}: columns {columns}"


def page_entries(form: str, page: str, markdown: str) -> list[list[dict]]:
    """Per section, its entries; a Markdown entry gets the column whose bold label precedes it."""
    if form == "html":
        return [html_blocks(text) for text in html_sections(page).values()]
    result = []
    for text in markdown_sections(markdown).values():
        labels = [(m.start(), m[1]) for m in re.finditer(r"^\*\*(.+?)\*\*: ", text, flags=re.M)]
        entries = []
        for entry in markdown_blocks(text):
            at = text.index(f"### {entry['heading']}\n" if entry["kind"] == "code"
                            else f"`{entry['symbol']}` at [{entry['text']}]({entry['href']}): ")
            entry["column"] = [label for start, label in labels if start < at][-1]
            entries.append(entry)
        result.append(entries)
    return result


@pytest.mark.parametrize("form", ["html", "markdown"])
def test_every_symbol_the_map_names_is_shown_once_per_column_then_linked(form, page, markdown):
    """Every symbol each cell links appears in its row and column, in the map's order: its code the
    first time its column names it (a method inside its class's block, when the column names the
    class too), a one-line mention linking back to that block after. Each block's code is
    ``inspect.getsource`` of its symbol (the file's line numbers beside it), no symbol's code shows
    twice in a column, and a mention's code is in the block it links to, which came before it or
    just above; in the HTML, a method's mention links the line of its definition in the block."""
    sections = page_entries(form, page, markdown)
    rows, layout = map_rows(), expected_layout()
    assert len(sections) == len(rows) == len(layout)
    ids = anchors(MARKDOWN_PAGE) if form == "markdown" else set(re.findall(r' id="([^"]+)"', page))
    concept_ids = {slug(row[0]) for row in rows}
    blocks: dict[str, dict] = {}  # anchor -> the code block, as the page has shown them so far
    shown: dict[str, list[str]] = {column: [] for column in COLUMNS}
    for row, entries, expected in zip(rows, sections, layout, strict=True):
        assert [(e["column"], e["kind"], e["symbol"]) for e in entries] == [
            (column, kind, symbol) for column, cell in zip(COLUMNS, expected, strict=True)
            for kind, symbol, _ in cell], row[0]
        paths = [path for cell in expected for _, _, path in cell]
        for entry, path in zip(entries, paths, strict=True):
            assert entry["text"].startswith(f"{path}:"), (row[0], entry["text"])
            source = expected_source(path, entry["symbol"])
            if entry["kind"] == "code":
                assert entry["code"] == source, f"{row[0]}: the code of {path}::{entry['symbol']} differs"
                assert not any(source in code or code in source for code in shown[entry["column"]]), (
                    f"{row[0]}: the code of {path}::{entry['symbol']} shows twice in {entry['column']}")
                shown[entry["column"]].append(source)
                if form == "markdown":
                    assert entry["heading"] == f"{entry['column']}: `{entry['symbol']}`"
                anchor = entry["id"] if form == "html" else slug(entry["heading"])
                assert anchor in ids and anchor not in blocks and anchor not in concept_ids, anchor
                if form == "html":
                    first = entry["numbers"][0]
                    assert entry["numbers"] == list(range(first, first + source.count("\n")))
                blocks[anchor] = entry
                continue
            target = entry["target"]
            block = next((b for anchor, b in blocks.items()
                          if target == anchor or target in b.get("line_ids", {}).values()), None)
            assert block is not None, f"{row[0]}: {entry['symbol']} links #{target}, no block shown before"
            assert target in ids and block["column"] == entry["column"]
            assert source in block["code"], f"{row[0]}: #{target} does not show {path}::{entry['symbol']}"
            if form == "html" and entry["symbol"] == block["symbol"]:
                assert target == block["id"], target
            elif form == "html":  # a method of the block's class: the line of its definition there
                number = next(n for n, line_id in block["line_ids"].items() if line_id == target)
                start = block["code"].index(source)
                assert number == block["numbers"][block["code"].count("\n", 0, start)], target
    assert sum(len(codes) for codes in shown.values()) >= 45


@pytest.mark.parametrize("form", ["html", "markdown"])
def test_each_block_lists_the_concepts_it_covers(form, page, markdown):
    """A block's "covers" links every concept whose cell in its column names its symbol or a symbol
    in it (a method of its class), in the map's order, each to that concept's section."""
    concept_ids = {plain(row[0]): slug(row[0]) for row in map_rows()}
    checked = 0
    for entries, row_cells in zip(page_entries(form, page, markdown), expected_layout(), strict=True):
        codes = [(column, symbol, path) for column, cell in zip(COLUMNS, row_cells, strict=True)
                 for kind, symbol, path in cell if kind == "code"]
        blocks = [entry for entry in entries if entry["kind"] == "code"]
        for block, (column, symbol, path) in zip(blocks, codes, strict=True):
            titles = expected_covers(column, symbol, path)
            assert [title for _, title in block["covers"]] == titles, (column, symbol)
            assert [target for target, _ in block["covers"]] == [concept_ids[t] for t in titles]
            checked += 1
    assert checked >= 45
    row = next(row for row in map_rows() if row[0].startswith("scaled dot-product attention"))
    attention = [b for b in html_blocks(html_sections(page)[slug(row[0])])
                 if b["kind"] == "code" and b["column"] == "explicit"]
    assert [title.split(" (")[0] for _, title in attention[0]["covers"]] == [
        "scaled dot-product attention", "head split and merge", "multi-head attention"]


def test_every_column_of_a_row_is_the_maps_cell(page):
    """The HTML's three columns hold the explicit, einsum and mathfirst cells in that order, each
    naming (shown or linked) every symbol its cell links."""
    for row, section_html in zip(map_rows(), html_sections(page).values(), strict=True):
        by_column: dict[str, list[str]] = {column: [] for column in COLUMNS}
        for block in html_blocks(section_html):
            by_column[block["column"]].append(block["symbol"])
        for column, cell in zip(COLUMNS, row[1:], strict=True):
            named = [symbol for symbol, _ in LINK.findall(cell)]
            assert [s for s in by_column[column] if s in named] == named, (row[0], column)


def definition_line(file: Path, line: int, symbol: str) -> bool:
    """Whether line ``line`` of ``file`` defines the last part of ``symbol``."""
    lines = file.read_text(encoding="utf-8").splitlines()
    if not 1 <= line <= len(lines):
        return False
    name = re.escape(symbol.rsplit(".", 1)[-1])
    return bool(re.match(rf"\s*((async\s+)?def|class)\s+{name}\b|\s*{name}\s*[:=]", lines[line - 1]))


def test_html_links_reach_files_definitions_and_anchors(page):
    """Every link of the HTML page reaches a file (relative to docs/) or an id of the page; a
    source link's #L line is the line its text names and the definition of its symbol."""
    ids = set(re.findall(r' id="([^"]+)"', page))
    hrefs = re.findall(r'href="([^"]+)"', page)
    assert len(hrefs) > 100
    for href in hrefs:
        path, _, anchor = html.unescape(href).partition("#")
        if not path:
            assert anchor in ids, f"#{anchor} is no id of the page"
            continue
        assert (DOCS / path).exists(), f"{href}: no such file"
        if anchor.startswith("L"):
            assert (DOCS / path).suffix == ".py", href
    sources = re.findall(r'<a class="source" data-symbol="([^"]+)" href="\.\./([^"#]+)#L(\d+)">([^<]+)</a>',
                         page)
    assert len(sources) >= 50 and len(sources) == page.count("#L")
    for symbol, path, line, text in sources:
        assert text == f"{path}:{line}", text
        assert definition_line(ROOT / path, int(line), symbol), f"{text} is not where {symbol} is defined"


def test_markdown_file_line_links_reach_definitions(markdown):
    found = re.findall(r"`([\w.]+)` (?:writes it )?at \[([\w./-]+\.py):(\d+)\]\(([^)]+)\)", markdown)
    assert len(found) >= 50 and len(found) == len(re.findall(r"\.py:\d+\]", markdown))
    for symbol, path, line, target in found:
        assert target == f"../{path}"
        assert (MARKDOWN_PAGE.parent / target).resolve() == (ROOT / path).resolve()
        assert definition_line(ROOT / path, int(line), symbol), f"{path}:{line} does not define {symbol}"


def test_marked_lines_are_the_ones_that_carry_the_style(page):
    """In the three style columns every line making the style's call is marked and every marked
    run starts on such a line; the attention rows mark something in each column."""
    sections = html_sections(page)
    for concept_id, section_html in sections.items():
        for block in html_blocks(section_html):
            if block["kind"] != "code":
                continue
            if block["column"] not in STYLE_LINE:
                assert block["marked"] == [], f"{concept_id}: the reference marks lines"
                continue
            pattern = STYLE_LINE[block["column"]]
            lines = dict(zip(block["numbers"], block["code"].splitlines(), strict=True))
            calling = {n for n, line in lines.items() if pattern.search(line.split("#")[0])}
            marked = set(block["marked"])
            assert calling <= marked, f"{concept_id} {block['symbol']}: unmarked {sorted(calling - marked)}"
            starts = [n for n in sorted(marked) if n - 1 not in marked]
            assert all(n in calling for n in starts), f"{concept_id} {block['symbol']}: {sorted(marked)}"
    code = {block["id"]: block for text in sections.values() for block in html_blocks(text)
            if block["kind"] == "code"}
    for concept in ATTENTION_ROWS:
        row = next(row for row in map_rows() if row[0].startswith(concept))
        for column in STYLE_LINE:
            marked = []  # in the lines of each symbol the cell names, wherever its block is
            for symbol, path in LINK.findall(row[1 + COLUMNS.index(column)]):
                lines, start = inspect.getsourcelines(live_object(path, symbol)[2])
                marked += [n for block in code.values() if block["column"] == column
                           and block["href"].startswith(f"../{path}#") for n in block["marked"]
                           if start <= n < start + len(lines)]
            assert marked, f"{concept}: nothing marked in {column}"


def test_each_paper_concept_shows_the_equation_from_mathfirsts_docstring(page):
    """A concept that cites a section of the paper shows an equation, and the equation is text
    of the docstring of the mathfirst symbol named beside it (or of that symbol's class)."""
    equations = re.findall(r'<section class="concept" id="([^"]+)">.*?(?:<div class="equation">(.*?)'
                           r'<span class="from">.*?data-symbol="([\w.]+)" href="\.\./([^"#]+)#|'
                           r'<div class="columns">)', page, flags=re.S)
    assert len(equations) == len(map_rows())
    for row, (concept_id, equation, symbol, path) in zip(map_rows(), equations, strict=True):
        if not re.search(r"\(\d+(\.\d+)*\)", row[0]):
            assert not equation, f"{concept_id} is no concept of the paper but shows an equation"
            continue
        assert equation, f"{concept_id} shows no equation"
        assert path.startswith("variants/mathfirst/") and symbol in row[3], (concept_id, symbol)
        _, holder, obj = live_object(path, symbol)
        docs = " ".join(inspect.getdoc(o) or "" for o in (obj, holder))
        assert html.unescape(equation) in docs, f"{concept_id}: the equation is not {symbol}'s docstring"
    attention = next(e for e in equations if e[0].startswith("scaled-dot-product-attention"))
    assert "softmax(Q K" in html.unescape(attention[1]) and "eq. 1" in attention[1]


def test_a_missing_symbol_or_unparsable_file_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    (tmp_path / "variants").mkdir()
    (tmp_path / "variants" / "m.py").write_text("def here():\n    pass\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "## Concept map\n\n| concept (paper §) | explicit | einsum | mathfirst | torch reference |\n"
        "|---|---|---|---|---|\n| thing (3.1) | [`here`](variants/m.py) | [`gone`](variants/m.py) "
        "| [`here`](variants/m.py) | x |\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"variants/m\.py defines no gone"):
        side_by_side.concepts(tmp_path)
    monkeypatch.setattr(side_by_side, "ROOT", tmp_path)
    assert side_by_side.main([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "defines no gone" in err and "Traceback" not in err
    assert not (tmp_path / "docs").exists() or not any((tmp_path / "docs").iterdir())
    (tmp_path / "variants" / "m.py").write_text("def here(:\n", encoding="utf-8")  # does not parse
    assert side_by_side.main([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


# ---------------------------------------------------------------- in a browser

MEASURE = """<script>
const box = e => e.getBoundingClientRect();
const rows = [...document.querySelectorAll("section.concept")].map(s => ({
  id: s.id,
  columns: [...s.querySelectorAll(":scope > .columns > .column")].map(c => ({
    top: box(c).top, left: box(c).left, right: box(c).right, width: box(c).width,
    scrollWidth: c.scrollWidth, clientWidth: c.clientWidth}))}));
const blocks = [...document.querySelectorAll(".highlight pre")].map(p => ({
  left: box(p).left, right: box(p).right, width: box(p).width, height: box(p).height,
  scrollWidth: p.scrollWidth, clientWidth: p.clientWidth, visible: p.checkVisibility({
    checkOpacity: true, checkVisibilityCSS: true})}));
const out = document.createElement("pre");
out.id = "layout";
out.textContent = JSON.stringify({viewport: window.innerWidth, rows, blocks,
  pageScrollWidth: document.documentElement.scrollWidth,
  pageClientWidth: document.documentElement.clientWidth});
document.body.append(out);
</script>"""
WIDTH = 1600


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is no PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow  # starts Chromium twice (about 5 s)
def test_in_chromium_the_columns_stand_side_by_side_and_nothing_overflows(page, tmp_path):
    browser = side_by_side.find_browser()
    if browser is None:
        pytest.skip("no Chromium on PATH: apt-get install -y chromium (as root)")
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", MEASURE + "\n</body>"), encoding="utf-8")
    dom = side_by_side.headless(browser, f"--user-data-dir={tmp_path / 'profile'}",
                                f"--window-size={WIDTH},1000", "--dump-dom", measured.as_uri()).stdout
    layout = json.loads(html.unescape(re.search(r'<pre id="layout">(.*?)</pre>', dom, flags=re.S)[1]))
    assert layout["viewport"] == WIDTH
    assert len(layout["rows"]) == len(map_rows())
    for row in layout["rows"]:
        columns = row["columns"]
        assert len(columns) == 3, row["id"]
        tops = [c["top"] for c in columns]
        assert max(tops) - min(tops) < 1, f"{row['id']}: the columns' tops differ: {tops}"
        for left, right in itertools.pairwise(columns):
            assert left["right"] <= right["left"], f"{row['id']}: columns overlap or stack"
        assert all(c["width"] > WIDTH / 4 for c in columns), f"{row['id']}: a column is narrow"
        assert all(c["scrollWidth"] <= c["clientWidth"] for c in columns), f"{row['id']}: a column overflows"
    assert layout["pageScrollWidth"] <= layout["pageClientWidth"], "the page scrolls sideways"
    assert len(layout["blocks"]) == page.count('<div class="highlight">')
    for block in layout["blocks"]:
        assert block["visible"] and block["width"] > 0 and block["height"] > 0, block
        assert block["left"] >= 0 and block["right"] <= WIDTH, block
        assert block["scrollWidth"] <= block["clientWidth"], f"a code block overflows: {block}"
    png = ROOT / side_by_side.SCREENSHOT  # the picture the Markdown page shows
    side_by_side.screenshot(HTML_PAGE, png, browser)
    assert png_size(png) == side_by_side.SCREENSHOT_SIZE
