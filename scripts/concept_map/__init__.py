"""The README's concept map, read from the source: each concept's row, and each symbol a cell links
as its file defines it now (the lines ``inspect.getsource`` gives, read with ``ast``).

    python -m scripts.concept_map    # each concept, then each column's symbols at path:first-last
    rows = concepts()                # one Concept per row, each Cell's Symbols read from the source

The package is the reader the programs that draw the map import: ``scripts.side_by_side`` (the
code side by side) and ``scripts.architecture`` (the picture of the architecture). Its
``__main__`` is the program, a reading aid: where each concept of the paper lives in each style,
by line, as the source stands now (a link to a symbol that moved is an error naming it). The
program is a leaf like every other; the package beneath it prints nothing.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The concept map's columns after the concept, in order; the first three are the teaching styles.
COLUMNS = ("explicit", "einsum", "mathfirst", "torch reference")
STYLES = COLUMNS[:3]
EQUATION_COLUMN = "mathfirst"  # the column whose docstrings give the paper's equations
# [`symbol`](file.py): the concept map's links (the pattern of tests/docs/pages.py's LINK)
LINK = re.compile(r"\[`([\w.]+)`\]\(([\w./-]+\.py)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
SECTION_NUMBER = re.compile(r"\((\d+(?:\.\d+)*)\)")  # "(3.2.1)": a concept of the paper


@dataclass(frozen=True)
class Symbol:
    """One symbol the concept map names, as its file defines it now."""

    name: str  # "Class.method", "function", "Class.attribute"
    path: str  # relative to the repository, with "/"
    first: int  # the first line of its source (a decorator's, if any)
    line: int  # the line of its def, class or assignment
    last: int
    source: str  # lines first..last, as inspect.getsource gives them
    docstring: str | None


@dataclass(frozen=True)
class Cell:
    column: str
    text: str  # the concept map's Markdown
    symbols: tuple[Symbol, ...]


@dataclass(frozen=True)
class Concept:
    title: str  # the concept map's Markdown
    equation: str | None  # the paper's, as mathfirst's docstring writes it
    equation_symbol: Symbol | None
    cells: tuple[Cell, ...]  # one per COLUMNS


def concept_map_rows(readme: str) -> list[list[str]]:
    """The concept map's body rows, each as its cells' Markdown: the concept, then COLUMNS."""
    match = re.search(r"^## Concept map\n(.*?)(?=^## |\Z)", readme, flags=re.M | re.S)
    if not match:
        raise ValueError("README.md has no '## Concept map' section")
    rows = [line for line in match.group(1).splitlines()
            if line.startswith("| ") and not line.startswith("| concept")]
    cells = [[cell.strip() for cell in row.strip().strip("|").split("|")] for row in rows]
    for row in cells:
        if len(row) != 1 + len(COLUMNS):
            raise ValueError(f"concept map row {row[0]!r} has {len(row)} cells, not {1 + len(COLUMNS)}")
    if not cells:
        raise ValueError("README.md's concept map has no rows")
    return cells


def find_symbol(root: Path, path: str, name: str) -> Symbol:
    """``name`` (``function``, ``Class``, ``Class.member``) as ``path`` defines it."""
    file = root / path
    if not file.is_file():
        raise ValueError(f"the concept map links {path}, which does not exist")
    text = file.read_text(encoding="utf-8")
    scope: list[ast.stmt] = ast.parse(text).body
    *classes, last_name = name.split(".")
    node: ast.stmt | None = None
    for class_name in classes:
        found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == class_name]
        if not found:
            raise ValueError(f"{path} defines no class {class_name} (the concept map names {name})")
        scope = found[0].body
    for candidate in scope:
        if isinstance(candidate, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [candidate.name]
        elif isinstance(candidate, ast.AnnAssign):
            names = [candidate.target.id] if isinstance(candidate.target, ast.Name) else []
        elif isinstance(candidate, ast.Assign):
            names = [t.id for t in candidate.targets if isinstance(t, ast.Name)]
        else:
            names = []
        if last_name in names:
            node = candidate
    if node is None:
        raise ValueError(f"{path} defines no {name} (the concept map names it)")
    decorators = getattr(node, "decorator_list", [])
    first = decorators[0].lineno if decorators else node.lineno
    lines = text.splitlines(keepends=True)
    docstring = (ast.get_docstring(node)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None)
    return Symbol(name, path, first, node.lineno, node.end_lineno,
                  "".join(lines[first - 1:node.end_lineno]), docstring)


def class_docstring(root: Path, symbol: Symbol) -> str | None:
    """The docstring of the class ``symbol`` is a member of, or None for a top-level symbol."""
    if "." not in symbol.name:
        return None
    return find_symbol(root, symbol.path, symbol.name.rsplit(".", 1)[0]).docstring


def equation(root: Path, title: str, cell: Cell) -> tuple[str | None, Symbol | None]:
    """The paper's equation for a concept of the paper (its title cites a section): the first
    paragraph of the first docstring of mathfirst's cell that cites a section (the symbols' own
    first, then their classes'), else of the first docstring there is."""
    if not SECTION_NUMBER.search(title):
        return None, None
    found = [(symbol.docstring, symbol) for symbol in cell.symbols]
    found += [(class_docstring(root, symbol), symbol) for symbol in cell.symbols]
    found = [(doc, symbol) for doc, symbol in found if doc]
    cited = [(doc, symbol) for doc, symbol in found if "section" in doc.split("\n\n")[0]]
    if not (cited or found):
        return None, None
    doc, symbol = (cited or found)[0]
    return doc.split("\n\n")[0].strip(), symbol


def concepts(root: Path = ROOT) -> list[Concept]:
    """Every row of the concept map, each linked symbol read from the source under ``root``."""
    rows = concept_map_rows((root / "README.md").read_text(encoding="utf-8"))
    result = []
    for title, *texts in rows:
        cells = tuple(Cell(column, text, tuple(find_symbol(root, path, name)
                                               for name, path in LINK.findall(text)))
                      for column, text in zip(COLUMNS, texts, strict=True))
        paper, symbol = equation(root, title, cells[COLUMNS.index(EQUATION_COLUMN)])
        result.append(Concept(title, paper, symbol, cells))
    return result


def plain(markdown: str) -> str:
    """A concept map cell without its links' targets and code spans' backticks."""
    return CODE_SPAN.sub(r"\1", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown))


def slug(title: str) -> str:
    """GitHub's anchor for a heading (as tests/docs/pages.py computes it)."""
    text = plain(title).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def listing(rows: list[Concept]) -> str:
    """The concept map as text: each concept's title, then per column each symbol its cell
    links, as ``path:first-last name``, or the cell's words where it links none."""
    width = max(len(column) for column in COLUMNS) + 1
    lines = []
    for concept in rows:
        lines.append(plain(concept.title))
        for cell in concept.cells:
            where = [f"{symbol.path}:{symbol.first}-{symbol.last} {symbol.name}" for symbol in cell.symbols]
            lines += [f"  {(cell.column + ':') if i == 0 else '':<{width}} {text}"
                      for i, text in enumerate(where or [plain(cell.text)])]
    return "\n".join(lines) + "\n"

