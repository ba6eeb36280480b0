"""Write the README's concept map as one page: each concept's equation above the three styles' code.

    python -m scripts.side_by_side                 # writes docs/side-by-side.html and .md
    python -m scripts.side_by_side --screenshot    # and docs/images/side-by-side.png (Chromium)

The rows are the concept map's (README.md, "Concept map"); each linked symbol's code is read
from the live source with ``ast`` (the lines ``inspect.getsource`` gives: decorators to the last
line of the body), so the page follows the code when it changes. The equation of a paper concept
is the first paragraph of mathfirst's docstring for it, which cites the paper's section. The
lines that carry a style are marked: the calls the concept map's test knows each style by
(``.view``/``.transpose``, ``einsum`` strings, mathfirst's ``einsum``/``rearrange`` patterns).
A symbol's code is shown once per column, under the first concept that names it, with every
concept it covers; a later concept that names it links back to that block instead.
The HTML is one static file (Pygments' CSS embedded, no script); both pages link the source
relative to the repository, and nothing in them depends on the machine or the time.
"""

from __future__ import annotations

import ast
import html
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from common.cli import Parser, first_line
from scripts.concept_map import (
    ROOT,
    STYLES,
    Cell,
    Concept,
    Symbol,
    concepts,
    plain,
    slug,
)

HTML_PAGE = Path("docs/side-by-side.html")
MARKDOWN_PAGE = Path("docs/side-by-side.md")
SCREENSHOT = Path("docs/images/side-by-side.png")
COMMAND = "python -m scripts.side_by_side"
TITLE = "The three styles side by side"
# The calls that carry each style (as tests/docs/test_concept_map.py knows them), and how the
# page names them.
STYLE_CALLS = {"explicit": {"view", "transpose"}, "einsum": {"einsum"},
               "mathfirst": {"einsum", "rearrange"}}
STYLE_WORDS = {"explicit": "`.view`/`.transpose`", "einsum": "the `einsum` strings",
               "mathfirst": "the `einsum`/`rearrange` patterns"}
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SCREENSHOT_SIZE = (1600, 1000)
SCREENSHOT_CONCEPT = "scaled dot-product attention"


@dataclass(frozen=True)
class Block:
    """The code the pages show once in a column: a symbol the column names that no other symbol it
    names contains (a class, say), holding the named symbols inside it (its methods)."""

    column: str
    symbol: Symbol
    anchor: str  # its id in the HTML, its heading's anchor in the Markdown
    home: str  # the concept (its Markdown title) under which the code is shown: the first to name it
    covers: tuple[str, ...]  # every concept whose cell in this column names it or a symbol in it

    def line_id(self, line: int) -> str:
        """The HTML id of the file's line ``line`` in this block."""
        return f"{self.anchor}-line-{line}"


@dataclass(frozen=True)
class Entry:
    """One item of a cell on the pages: a block's code, or one line that links to it."""

    symbol: Symbol  # the symbol the cell names (for code: the block's own)
    block: Block
    code: bool
    concept: str  # the concept (its Markdown title) whose cell this is


def style_lines(symbol: Symbol, column: str) -> list[int]:
    """The file's line numbers, within ``symbol``, of every call that carries ``column``'s style."""
    calls = STYLE_CALLS.get(column, set())
    tree = ast.parse(textwrap.dedent(symbol.source))
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in calls:
                lines.update(range(node.lineno, node.end_lineno + 1))
    return sorted(line + symbol.first - 1 for line in lines)


def spans(lines: list[int]) -> list[tuple[int, int]]:
    """Consecutive line numbers as (first, last) runs."""
    runs: list[tuple[int, int]] = []
    for line in lines:
        if runs and line == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], line)
        else:
            runs.append((line, line))
    return runs


def lines_text(lines: list[int]) -> str:
    """"line 9", "lines 9–11, 14": the file's line numbers, consecutive ones as a range."""
    runs = spans(lines)
    word = "line" if runs == [(lines[0], lines[0])] else "lines"
    return f"{word} " + ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


def block_heading(column: str, symbol: Symbol) -> str:
    """The Markdown heading of a block (its anchor is the HTML block's id too)."""
    return f"{column}: `{symbol.name}`"


def container(symbol: Symbol, named: list[Symbol]) -> Symbol:
    """The widest of ``named`` (``symbol`` among them) whose lines hold ``symbol``'s."""
    holding = [other for other in named if other.path == symbol.path
               and other.first <= symbol.first and symbol.last <= other.last]
    return max(holding, key=lambda other: other.last - other.first)


def placement(rows: list[Concept]) -> list[list[list[Entry]]]:
    """Per concept, per cell, what the pages show: the first time a column names a symbol of a
    block, the block's code, then a line for each named symbol that is not the block's own symbol
    or whose block was shown before. Anchors are GitHub's, numbered as the Markdown page's headings
    come: the title, then each concept's heading and the headings of the blocks it shows."""
    named: dict[str, list[Symbol]] = {}
    for concept in rows:
        for cell in concept.cells:
            named.setdefault(cell.column, []).extend(
                symbol for symbol in cell.symbols if symbol not in named.get(cell.column, []))
    covers: dict[tuple[str, Symbol], list[str]] = {}
    for concept in rows:
        for cell in concept.cells:
            for symbol in cell.symbols:
                titles = covers.setdefault((cell.column, container(symbol, named[cell.column])), [])
                if concept.title not in titles:
                    titles.append(concept.title)
    seen: dict[str, int] = {}

    def anchor(heading: str) -> str:
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        return base if count == 0 else f"{base}-{count}"

    anchor(TITLE)
    blocks: dict[tuple[str, Symbol], Block] = {}
    result = []
    for concept in rows:
        anchor(concept.title)
        cells = []
        for cell in concept.cells:
            entries = []
            for symbol in cell.symbols:
                outer = container(symbol, named[cell.column])
                key = (cell.column, outer)
                first = key not in blocks
                if first:
                    blocks[key] = Block(cell.column, outer, anchor(block_heading(cell.column, outer)),
                                        concept.title, tuple(covers[key]))
                    entries.append(Entry(outer, blocks[key], True, concept.title))
                if not first or symbol != outer:
                    entries.append(Entry(symbol, blocks[key], False, concept.title))
            cells.append(entries)
        result.append(cells)
    return result


def markdown_cell(markdown: str, prefix: str) -> str:
    """A concept map cell for a page one folder down: its relative links get ``prefix``."""
    return re.sub(r"\]\(((?!#|[a-z]+:)[^)]*)\)", lambda m: f"]({prefix}{m.group(1)})", markdown)


def html_cell(markdown: str, prefix: str) -> str:
    """A concept map cell as HTML: its links and code spans, everything else escaped."""
    parts, last = [], 0
    for match in re.finditer(r"\[`([^`]*)`\]\(([^)]*)\)|`([^`\n]+)`", markdown):
        parts.append(html.escape(markdown[last:match.start()]))
        if match.group(3) is not None:
            parts.append(f"<code>{html.escape(match.group(3))}</code>")
        else:
            href = match.group(2) if match.group(2).startswith("#") else prefix + match.group(2)
            parts.append(f'<a href="{html.escape(href)}"><code>{html.escape(match.group(1))}</code></a>')
        last = match.end()
    parts.append(html.escape(markdown[last:]))
    return "".join(parts)


# ---------------------------------------------------------------- HTML

CSS = """
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328;
       background: #fff; }
main { box-sizing: border-box; max-width: 1800px; margin: 0 auto; padding: 12px 20px 40px; }
h1 { font-size: 24px; margin: 0 0 6px; }
h2 { font-size: 19px; margin: 0 0 6px; }
h3 { font-size: 15px; margin: 0 0 4px; }
p { margin: 4px 0; }
code { font: 13px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
nav { margin: 8px 0 4px; font-size: 14px; }
nav a { white-space: nowrap; margin-right: 10px; }
section.concept { border-top: 2px solid #d0d7de; padding-top: 12px; margin-top: 18px; }
.equation { margin: 4px 0 10px; padding: 6px 10px; background: #f6f8fa; border-left: 3px solid #8250df;
            white-space: pre-wrap; overflow-wrap: anywhere; font: 14px/1.45 ui-monospace,
            "DejaVu Sans Mono", Menlo, Consolas, monospace; }
.equation .from { display: block; font: 12px/1.4 system-ui, sans-serif; color: #57606a; }
.columns { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 14px; }
.column { min-width: 0; }
.reference { margin-top: 10px; }
.block { margin: 6px 0 10px; }
.where { font-size: 12px; color: #57606a; margin: 2px 0; }
.where a { color: #0969da; }
.covers { font-size: 12px; color: #57606a; margin: 2px 0; }
.highlight { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 4px; }
.highlight pre { margin: 0; padding: 6px 8px; white-space: pre-wrap; overflow-wrap: anywhere;
                 font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
/* one block per source line: a line too long for its column wraps under its own text */
.highlight code > span { display: block; padding-left: 9ch; text-indent: -9ch; }
.highlight .hll { display: block; background-color: #fff1a8; }
.highlight .linenos { display: inline-block; width: 4ch; margin-right: 1ch; text-indent: 0;
                      text-align: right; color: #8c959f; user-select: none; }
.legend .hll { background-color: #fff1a8; padding: 0 4px; }
"""


def source_link(symbol: Symbol) -> str:
    """A link to the line that defines ``symbol``, relative to docs/, its text file:line."""
    return (f'<a class="source" data-symbol="{html.escape(symbol.name)}" '
            f'href="../{symbol.path}#L{symbol.line}">{symbol.path}:{symbol.line}</a>')


def code_html(block: Block) -> str:
    symbol, column = block.symbol, block.column
    marked = [line - symbol.first + 1 for line in style_lines(symbol, column)]
    formatter = HtmlFormatter(linenos="inline", linenostart=symbol.first, hl_lines=marked,
                              wrapcode=True, linespans=f"{block.anchor}-line")
    where = (f'<p class="where"><code>{html.escape(symbol.name)}</code> · '
             f"{source_link(symbol)}")
    if marked:
        where += f" · style: {lines_text(style_lines(symbol, column))}"
    covers = ", ".join(f'<a href="#{slug(title)}">{html.escape(plain(title))}</a>' for title in block.covers)
    return (f'<div class="block" id="{block.anchor}">{where}</p>\n<p class="covers">covers: {covers}</p>\n'
            f"{highlight(symbol.source, PythonLexer(), formatter)}</div>")


def reference_text(entry: Entry) -> str:
    """Where a mention's code is: "shown under …", or "in `Class`, shown under …" ("above" in the
    concept that shows it)."""
    inside = "" if entry.symbol == entry.block.symbol else f"in `{entry.block.symbol.name}`, "
    where = "above" if entry.block.home == entry.concept else f"under {plain(entry.block.home)}"
    return f"{inside}shown {where}"


def reference_html(entry: Entry) -> str:
    """A mention of a symbol whose code another block shows: one line that links to its first line
    there (to the block itself if it is the block's own symbol)."""
    symbol, block = entry.symbol, entry.block
    target = block.anchor if symbol == block.symbol else block.line_id(symbol.first)
    return (f'<div class="block shown"><p class="where"><code>{html.escape(symbol.name)}</code> · '
            f'{source_link(symbol)} · <a class="shown" href="#{target}">'
            f"{html_cell(reference_text(entry), '')}</a></p></div>")


def column_html(cell: Cell, entries: list[Entry], css_class: str) -> str:
    blocks = "\n".join(code_html(entry.block) if entry.code else reference_html(entry) for entry in entries)
    return (f'<div class="{css_class}" data-column="{html.escape(cell.column)}">'
            f"<h3>{html.escape(cell.column)}</h3><p>{html_cell(cell.text, '../')}</p>\n{blocks}</div>")


def concept_html(concept: Concept, entries: list[list[Entry]]) -> str:
    concept_id = slug(concept.title)
    parts = [f'<section class="concept" id="{concept_id}">',
             f"<h2>{html_cell(concept.title, '../')}</h2>"]
    if concept.equation:
        source = concept.equation_symbol
        parts.append(f'<div class="equation">{html.escape(concept.equation)}'
                     f'<span class="from">the paper, as mathfirst\'s <code>{html.escape(source.name)}</code> '
                     f"writes it ({source_link(source)})"
                     f"</span></div>")
    cells = list(zip(concept.cells, entries, strict=True))
    columns = "\n".join(column_html(cell, shown, "column") for cell, shown in cells if cell.column in STYLES)
    parts.append(f'<div class="columns">\n{columns}\n</div>')
    parts += [column_html(cell, shown, "reference") for cell, shown in cells if cell.column not in STYLES]
    parts.append("</section>")
    return "\n".join(parts)


def render_html(rows: list[Concept]) -> str:
    style = HtmlFormatter().get_style_defs(".highlight")
    nav = " ".join(f'<a href="#{slug(c.title)}">{html.escape(plain(c.title))}</a>' for c in rows)
    body = "\n".join(concept_html(concept, entries)
                     for concept, entries in zip(rows, placement(rows), strict=True))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{TITLE}</title>
<style>
{style}
{CSS.strip()}
</style>
</head>
<body>
<main>
<h1>{TITLE}</h1>
<p>Each concept of the paper: its equation as mathfirst's docstring writes it, then the code of
explicit, einsum and mathfirst in three columns, and the torch reference's beneath them. The rows
and symbols are the <a href="../README.md#concept-map">README's concept map</a>; the code is the
live source, with each file's line numbers, shown once per column: under the first concept that
names it, with every concept it covers; a later concept links back to it.
<span class="legend"><span class="hll">Marked lines</span> carry the style:
<code>.view</code>/<code>.transpose</code> in explicit, the <code>einsum</code> strings in einsum,
the <code>einsum</code>/<code>rearrange</code> patterns in mathfirst.</span>
Written by <code>{COMMAND}</code>; the same in Markdown: <a href="side-by-side.md">side-by-side.md</a>.</p>
<nav>{nav}</nav>
{body}
</main>
</body>
</html>
"""


# ---------------------------------------------------------------- Markdown

def code_markdown(block: Block) -> str:
    symbol, column = block.symbol, block.column
    marked = style_lines(symbol, column)
    covers = ", ".join(f"[{plain(title)}](#{slug(title)})" for title in block.covers)
    where = f"`{symbol.name}` at [{symbol.path}:{symbol.line}](../{symbol.path}); covers {covers}"
    if marked:
        where += f"; {STYLE_WORDS[column]} on {lines_text(marked)}"
    return (f"### {block_heading(column, symbol)}\n\n{where}:\n\n"
            f"```python\n{symbol.source}```\n")


def reference_markdown(entry: Entry) -> str:
    """A mention of a symbol whose code another block shows: one line that links to the block."""
    symbol = entry.symbol
    return (f"`{symbol.name}` at [{symbol.path}:{symbol.line}](../{symbol.path}): "
            f"[{reference_text(entry)}](#{entry.block.anchor}).\n")


def concept_markdown(concept: Concept, entries: list[list[Entry]]) -> str:
    parts = [f"## {plain(concept.title)}\n"]
    if concept.equation:
        source = concept.equation_symbol
        parts.append(f"The paper, as mathfirst's `{source.name}` writes it at "
                     f"[{source.path}:{source.line}](../{source.path}):\n\n```text\n{concept.equation}\n```\n")
    for cell, shown in zip(concept.cells, entries, strict=True):
        parts.append(f"**{cell.column}**: {markdown_cell(cell.text, '../')}\n")
        parts += [code_markdown(entry.block) if entry.code else reference_markdown(entry) for entry in shown]
    return "\n".join(parts)


def render_markdown(rows: list[Concept]) -> str:
    contents = "\n".join(f"- [{plain(c.title)}](#{slug(c.title)})" for c in rows)
    body = "\n".join(concept_markdown(concept, entries)
                     for concept, entries in zip(rows, placement(rows), strict=True))
    return f"""# {TITLE}

This page covers each concept of the paper as the three styles write it: the equation as
mathfirst's docstring gives it, then the code of explicit, einsum and mathfirst (and the torch
reference's where it has code of its own), one after another. The rows and symbols are the
[README's concept map](../README.md#concept-map), the code is the live source with its file and
line, and `{COMMAND}` writes this page and its column view,
[side-by-side.html](side-by-side.html) (a static file: open it from a clone), which looks like this:

![The scaled dot-product attention row of side-by-side.html in three columns](images/side-by-side.png)

Each symbol's code is shown once per column, under the first concept that names it, with the
concepts it covers; a later concept that names it links back to it. The lines that carry each
style are listed above its code: {STYLE_WORDS["explicit"]} in explicit, {STYLE_WORDS["einsum"]}
in einsum, {STYLE_WORDS["mathfirst"]} in mathfirst.

{contents}

{body}"""


# ---------------------------------------------------------------- writing and the browser

def pages(root: Path = ROOT) -> dict[Path, str]:
    """What the command writes: {path relative to ``root``: text}."""
    rows = concepts(root)
    return {HTML_PAGE: render_html(rows), MARKDOWN_PAGE: render_markdown(rows)}


def find_browser() -> str | None:
    """A Chromium-family browser on PATH, or None."""
    return next((found for name in BROWSER_NAMES if (found := shutil.which(name))), None)


def headless(browser: str, *arguments: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the browser headless with ``arguments``; its stdout is text."""
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)


def screenshot(page: Path, png: Path, browser: str, size: tuple[int, int] = SCREENSHOT_SIZE,
               concept: str = SCREENSHOT_CONCEPT) -> None:
    """A ``size`` screenshot of ``page`` showing its head and ``concept``'s row. Headless
    Chromium shoots a scrolled page blank, so a copy beside it (the same folder, so the same
    relative links) hides the other rows instead of scrolling past them."""
    png.parent.mkdir(parents=True, exist_ok=True)
    only = f'<style>section.concept:not([id^="{slug(concept)}"]) {{ display: none; }}</style>'
    text = page.read_text(encoding="utf-8").replace("</head>", f"{only}\n</head>")
    with tempfile.TemporaryDirectory() as profile, \
            tempfile.NamedTemporaryFile("w", suffix=".html", dir=page.parent, encoding="utf-8") as copy:
        copy.write(text)
        copy.flush()
        headless(browser, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                 f"--screenshot={png.resolve()}", Path(copy.name).as_uri())
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot to {png}")


def write(root: Path = ROOT) -> list[Path]:
    written = []
    for path, text in pages(root).items():
        (root / path).write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--screenshot", action="store_true",
                        help=f"also write {SCREENSHOT} with headless Chromium")
    args = parser.parse_args(argv)
    browser = find_browser()
    if args.screenshot and browser is None:
        parser.error("--screenshot needs Chromium on PATH (apt-get install -y chromium)")
    try:
        written = write(ROOT)
        if args.screenshot:
            screenshot(ROOT / HTML_PAGE, ROOT / SCREENSHOT, browser)
            written.append(SCREENSHOT)
    except (ValueError, SyntaxError, OSError, RuntimeError, subprocess.SubprocessError) as error:
        print(f"{COMMAND}: {first_line(error)}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path} ({(ROOT / path).stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
