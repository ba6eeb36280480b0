"""The README and docs/ cannot go stale: links, the concept map, measured tables, the quick start.

Every page is README.md or a page of docs/. On every page, a link whose text is a code span and
whose target is a ``.py`` file names a symbol that file defines; every relative link reaches a
file or folder, and every ``#anchor`` a heading of the page it points into. Tables that a script
regenerates are compared with what the script prints, on the page that holds them.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_PAGE = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README_PAGE, *sorted(DOCS.glob("*.md"))]
README = README_PAGE.read_text(encoding="utf-8")
LINK = re.compile(r"\[`([\w.]+)`\]\(([\w./-]+\.py)\)")
# any Markdown link [text](target); text may hold code spans, but no bracket and no line break
ANY_LINK = re.compile(r"\[((?:[^\[\]\n`]|`[^`\n]*`)*)\]\(([^()\s]+)\)")
FENCE = re.compile(r"^```.*?^```[ \t]*$", flags=re.M | re.S)
README_LIMIT = 15_000  # bytes


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def section(title: str, page: Path = README_PAGE) -> str:
    """The text of ``page`` under the level-2 heading ``title``, up to the next one."""
    text = page.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"{page_id(page)} has no '## {title}' section"
    return match.group(1)


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


def symbol_links() -> list[tuple[Path, str, str]]:
    """(page, symbol, target) for every [`symbol`](file.py) link; a file name is no symbol."""
    return sorted({(page, symbol, target) for page in PAGES for symbol, target in LINK.findall(prose(page))
                   if not symbol.endswith(".py")})


CONCEPT_LINKS = sorted(set(LINK.findall(section("Concept map"))))
SYMBOL_LINKS = symbol_links()


def test_concept_map_has_a_row_per_concept_and_a_link_per_variant():
    rows = [line for line in section("Concept map").splitlines()
            if line.startswith("| ") and not line.startswith("| concept")]
    assert len(rows) >= 15
    for row in rows:
        cells = row.strip("|").split("|")
        assert len(cells) == 5, row
        for cell in cells[1:4]:  # explicit, einsum, mathfirst: each names its implementation
            assert "`" in cell, row


@pytest.mark.parametrize(("symbol", "path"), CONCEPT_LINKS,
                         ids=[f"{path}::{symbol}" for symbol, path in CONCEPT_LINKS])
def test_concept_map_links_name_symbols_that_exist(symbol, path):
    file = ROOT / path
    assert file.is_file(), f"{path} does not exist"
    assert symbol in defined_names(file), f"{path} defines no {symbol}"


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


def test_readme_is_short_and_links_every_docs_page():
    assert len(README.encode("utf-8")) <= README_LIMIT, "README.md is over 15,000 bytes: move detail to docs/"
    linked = {target.partition("#")[0] for _, target in links(README_PAGE)}
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in linked, f"README does not link docs/{page.name}"


@pytest.mark.parametrize("page", PAGES[1:], ids=page_id)
def test_each_docs_page_opens_with_what_it_covers(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{page_id(page)} has no title"
    first = next(line for line in lines[1:] if line.strip())
    assert first.startswith("This page covers "), f"{page_id(page)} opens with {first!r}"


def test_set_up_is_what_ci_runs():
    """The README's set-up block is exactly the commands .ci/run runs after its preamble."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [line for line in ci if line and not line.startswith(("#", "set ", "cd "))]
    block = section("Set-up").split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() == commands == ['pip install -e ".[dev,plot]"', "python -m pytest",
                                              "python -m pytest -m slow"]


def test_headline_results_come_from_the_full_table_of_their_command():
    """Each number of the README's results table stands in that variant's rows of the table that
    the same compare.py command printed in docs/benchmarks.md."""
    results = section("Results")
    command = results.split("```bash\n", 1)[1].split("```", 1)[0].strip()
    assert command.startswith("python compare.py")
    full = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    assert f"```bash\n{command}\n```" in full, "docs/benchmarks.md lacks the README's results command"
    printed = full.split(f"```bash\n{command}\n```", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    number = re.compile(r"\d[\d.,]*(?:e[+-]\d+)?[x%]?")
    rows = [line for line in results.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")]
    assert len(rows) == 4
    for row in rows:
        variant = row.split("|")[1].strip()
        full_rows = [line for line in printed.splitlines() if line.startswith(f"| {variant} ")]
        assert len(full_rows) == 2, variant
        shown = set(number.findall("".join(full_rows)))
        for cell in row.split("|")[2:-1]:
            for value in number.findall(cell):
                assert value in shown, f"README's {variant} row shows {value}, not in the full table"


def assert_section_shows(printed: str, page_section: str) -> None:
    """Every table row of ``printed`` stands in that page section."""
    table_rows = [line for line in printed.splitlines() if line.startswith("| ")]
    assert len(table_rows) > 4
    for row in table_rows:
        assert row in page_section, f"the table lacks or differs on:\n{row}"


def assert_page_shows(script: str, page_section: str) -> None:
    """Every table row that ``python -m scripts.<script>`` prints stands in that page section."""
    printed = subprocess.run([sys.executable, "-m", f"scripts.{script}"], cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=600).stdout
    assert_section_shows(printed, page_section)


def test_deviation_table_matches_the_script():
    assert_page_shows("deviations", section("Deviations from the sources", DOCS / "variants.md"))


def test_low_precision_table_is_what_the_script_prints_of_its_measurement(monkeypatch, capsys):
    """The table is the script's own output for the cells it records in ``MEASURED``; that
    ``MEASURED`` is what the script measures today is checked by the slow
    tests/equivalence/test_numerics.py::test_the_recorded_measurement_is_what_the_script_measures.
    Together: the page shows a live measurement, measured once per run of the slow tests, not
    twice (each measurement takes minutes)."""
    from scripts import low_precision

    def recorded(seeds: int = low_precision.SEEDS):
        assert seeds == low_precision.SEEDS, "the page shows the default seeds"
        return low_precision.MEASURED

    monkeypatch.setattr(low_precision, "measure", recorded)
    assert low_precision.main([]) == 0
    assert_section_shows(capsys.readouterr().out,
                         section("Low precision: measured tolerances", DOCS / "numerics.md"))


def test_quick_start_runs_and_the_two_variants_agree():
    code = section("Quick start").split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {"print": lambda *args: None}
    exec(code, namespace)
    assert namespace["a"].shape == (2, 7, 100)
    assert (namespace["a"] - namespace["b"]).abs().max() < 1e-5
