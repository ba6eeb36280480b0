"""Reading the Markdown pages: their sections, links, headings and the symbols their links name.

The pages are README.md, the pages of docs/ and the run logs of docs/results/. The tests of
tests/docs import these helpers; nothing here asserts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_PAGE = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
DOCS_PAGES = sorted(DOCS.glob("*.md"))
RESULT_PAGES = sorted(RESULTS.glob("*.md"))
RESULTS_INDEX = RESULTS / "README.md"  # the list of every dated run
PAGES = [README_PAGE, *DOCS_PAGES, *RESULT_PAGES]
README = README_PAGE.read_text(encoding="utf-8")
# [`symbol`](file.py): a link whose text is a code span and whose target is a Python file
LINK = re.compile(r"\[`([\w.]+)`\]\(([\w./-]+\.py)\)")
# any Markdown link [text](target); text may hold code spans, but no bracket and no line break
ANY_LINK = re.compile(r"\[((?:[^\[\]\n`]|`[^`\n]*`)*)\]\(([^()\s]+)\)")
FENCE = re.compile(r"^```.*?^```[ \t]*$", flags=re.M | re.S)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def section(title: str, page: Path = README_PAGE) -> str:
    """The text of ``page`` under the level-2 heading ``title``, up to the next one."""
    text = page.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"{page_id(page)} has no '## {title}' section"
    return match.group(1)


def table_rows(text: str, header: str) -> list[str]:
    """The body rows of every Markdown table in ``text``, less its header and separator rows;
    ``header`` is the first cell's text in the header row."""
    return [line for line in text.splitlines()
            if line.startswith("| ") and not line.startswith((f"| {header} ", "|---", "| ---"))]


def fenced_block(text: str, language: str) -> str:
    """The first ```language fenced block of ``text``, without its fences."""
    return text.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def defined_names(path: Path) -> set[str]:
    """Top-level functions, classes and assignments, and Class.member for class bodies."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(f"{node.name}.{member.name}")
                elif isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name):
                    names.add(f"{node.name}.{member.target.id}")
                elif isinstance(member, ast.Assign):
                    names.update(f"{node.name}.{t.id}" for t in member.targets
                                 if isinstance(t, ast.Name))
    return names


def function_node(path: Path, symbol: str) -> ast.FunctionDef | None:
    """The definition of ``symbol`` (``function`` or ``Class.method``) in ``path``, or None."""
    scope: list[ast.stmt] = ast.parse(path.read_text(encoding="utf-8")).body
    *classes, name = symbol.split(".")
    for class_name in classes:
        found = [node for node in scope if isinstance(node, ast.ClassDef) and node.name == class_name]
        if not found:
            return None
        scope = found[0].body
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def called_names(function: ast.AST) -> set[str]:
    """The name of every call in ``function``'s body: ``f`` for ``f(...)``, ``m`` for ``x.m(...)``."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names.add(node.func.attr)
    return names


def prose(page: Path) -> str:
    """The page without its fenced code blocks (where brackets are code, not links)."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def links(page: Path) -> list[tuple[str, str]]:
    """Every (text, target) Markdown link in the page's prose."""
    return ANY_LINK.findall(prose(page))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose(page), flags=re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found
