"""The README's concept map and measured tables cannot go stale."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
LINK = re.compile(r"\[`([\w.]+)`\]\(([\w./-]+\.py)\)")


def section(title: str) -> str:
    """The README text under the level-2 heading ``title``, up to the next one."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.M | re.S)
    assert match, f"README has no '## {title}' section"
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


CONCEPT_LINKS = sorted(set(LINK.findall(section("Concept map"))))


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


def assert_readme_shows(script: str, readme_section: str) -> None:
    """Every table row that ``python -m scripts.<script>`` prints stands in that README section."""
    printed = subprocess.run([sys.executable, "-m", f"scripts.{script}"], cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=600).stdout
    table_rows = [line for line in printed.splitlines() if line.startswith("| ")]
    assert len(table_rows) > 4
    for row in table_rows:
        assert row in readme_section, f"README's table lacks or differs on:\n{row}"


def test_deviation_table_matches_the_script():
    assert_readme_shows("deviations", section("Deviations from the sources"))


@pytest.mark.slow
def test_low_precision_table_matches_the_script():
    assert_readme_shows("low_precision", section("Numerics and errors"))


def test_quick_start_runs_and_the_two_variants_agree():
    code = section("Quick start").split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {"print": lambda *args: None}
    exec(code, namespace)
    assert namespace["a"].shape == (2, 7, 100)
    assert (namespace["a"] - namespace["b"]).abs().max() < 1e-5
