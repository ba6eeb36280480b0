"""Draw the layout tree of docs/architecture.md from the code: each package with its index's first sentence.

    python -m scripts.layout            # prints the tree
    python -m scripts.layout --write    # and writes it into docs/architecture.md's Layout section

A package's line is the first sentence of its ``__init__`` docstring (the package's index, which
tests/test_indexes.py holds to naming every module in it), on one line: without its
parentheticals, and where it is still too long, up to the last clause (a comma, colon or
semicolon) that fits; the index holds the rest. The top packages come in the order imports run
(``TOP``), each followed by its subpackages, indented two spaces a level; docs/, tests/ and
compare.py, which are not packages, close the tree as fixed lines (``FIXED``).
tests/scripts/test_layout.py checks that the page's tree is what this prints, so a package's
summary cannot change without the page following.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from common.cli import Parser, first_line

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m scripts.layout"
PAGE = Path("docs/architecture.md")
SECTION = "## Layout"  # the page's heading starts so; the tree is the first ```text block under it
TOP = ("common", "variants", "seq2seq", "benchmarks", "scripts")  # the order imports run
# (name, what it holds) of the tree's lines that no package's index gives
FIXED = (
    ("docs/", "The reference pages the README links to; docs/results/, dated runs and their JSON"),
    ("tests/", "Mirrors the packages, scripts/ and docs/; test_layering.py holds the import rule"),
    ("compare.py", "`python compare.py`: a thin command over benchmarks/compare/"),
)
NAME_WIDTH = 15  # the first column: a name, indented by its depth, then at least one space
WIDTH = 100  # the longest line
PARENTHETICAL = re.compile(r"\s*\([^()]*\)")
CLAUSE_END = re.compile(r"[,:;](?= )")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`])")


def summary(docstring: str, width: int = WIDTH - NAME_WIDTH) -> str:
    """The first sentence of a docstring's first paragraph in at most ``width`` characters: with
    reST's double backticks as Markdown's single ones, no parentheticals, no closing stop or
    colon, and cut after its last clause that fits when it is longer."""
    paragraph = " ".join(docstring.strip().split("\n\n", 1)[0].split())
    sentence = SENTENCE_END.split(paragraph, maxsplit=1)[0].replace("``", "`")
    while PARENTHETICAL.search(sentence):
        sentence = PARENTHETICAL.sub("", sentence)
    sentence = sentence.rstrip(".:")
    if len(sentence) <= width:
        return sentence
    cuts = [match.start() for match in CLAUSE_END.finditer(sentence) if match.start() <= width]
    if not cuts:
        raise ValueError(f"no clause of at most {width} characters opens {sentence[:width]!r}...")
    return sentence[:cuts[-1]]


def package_summary(package: Path, root: Path) -> str:
    init = package / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"), filename=str(init)))
    if not docstring:
        raise ValueError(f"{init.relative_to(root)} has no docstring to summarise the package")
    try:
        return summary(docstring)
    except ValueError as error:
        raise ValueError(f"{init.relative_to(root)}: {error}") from None


def line(name: str, text: str) -> list[str]:
    """``name`` in the first column and ``text`` beside it."""
    return [f"{name.ljust(max(NAME_WIDTH, len(name) + 1))}{text}"]


def package_lines(package: Path, root: Path, depth: int) -> list[str]:
    lines = line("  " * depth + package.name + "/", package_summary(package, root))
    for sub in sorted(path.parent for path in package.glob("*/__init__.py")):
        lines += package_lines(sub, root, depth + 1)
    return lines


def tree(root: Path = ROOT, top: tuple[str, ...] = TOP,
         fixed: tuple[tuple[str, str], ...] = FIXED) -> str:
    """The layout tree of the packages ``top`` under ``root``, then the ``fixed`` lines."""
    lines = []
    for name in top:
        if not (root / name / "__init__.py").is_file():
            raise ValueError(f"{name}/ under {root} is not a package (no __init__.py)")
        lines += package_lines(root / name, root, 0)
    for name, text in fixed:
        lines += line(name, text)
    return "\n".join(lines) + "\n"


def layout_block(page_text: str, page: Path) -> re.Match[str]:
    """The match of the first ```text block under the page's Layout heading; group 1 is the tree."""
    heading = re.search(rf"^{re.escape(SECTION)}\b.*$", page_text, flags=re.M)
    if not heading:
        raise ValueError(f"{page}: no '{SECTION}' heading")
    block = re.compile(r"^```text\n(.*?)^```[ \t]*$", flags=re.M | re.S).search(page_text, heading.end())
    next_heading = re.compile(r"^## ", flags=re.M).search(page_text, heading.end())
    if not block or (next_heading and next_heading.start() < block.start()):
        raise ValueError(f"{page}: no ```text block under '{SECTION}'")
    return block


def page_tree(page: Path) -> str:
    """The tree the page shows now."""
    return layout_block(page.read_text(encoding="utf-8"), page).group(1)


def write(page: Path, text: str) -> bool:
    """Put ``text`` in the page's layout block; True when the page changed."""
    old = page.read_text(encoding="utf-8")
    block = layout_block(old, page)
    new = old[:block.start(1)] + text + old[block.end(1):]
    if new != old:
        page.write_text(new, encoding="utf-8")
    return new != old


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the tree into {PAGE}")
    args = parser.parse_args(argv)
    try:
        text = tree(ROOT)
        changed = write(ROOT / PAGE, text) if args.write else None
    except (ValueError, SyntaxError, OSError) as error:
        print(f"{COMMAND}: {first_line(error)}", file=sys.stderr)
        return 1
    print(text, end="")
    if args.write:
        print(f"{'wrote' if changed else 'unchanged:'} the layout tree of {PAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
