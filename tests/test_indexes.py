"""One map of the tree, kept true by test: every package's index (its ``__init__`` docstring)
names every module and subpackage in it, the tree in docs/architecture.md names every package
of the project, and tests/ mirrors the packages' subpackages."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("common", "variants", "seq2seq", "benchmarks", "scripts")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def packages() -> list[Path]:
    """Every package folder of the project (tests/ aside), the top ones first."""
    found = []
    for top in TOP:
        found += sorted(path.parent for path in (ROOT / top).rglob("__init__.py"))
    return found


def index_words(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""


def members(package: Path) -> list[str]:
    """The modules (``name``) and subpackages (``name/``) directly inside ``package``."""
    modules = [path.stem for path in package.glob("*.py") if path.stem not in ("__init__", "__main__")]
    modules += [path.name for path in package.glob("*.sh")]
    subpackages = [f"{path.parent.name}/" for path in package.glob("*/__init__.py")]
    return sorted(modules) + sorted(subpackages)


@pytest.mark.parametrize("package", packages(), ids=lambda path: str(path.relative_to(ROOT)))
def test_each_package_index_names_every_module_in_it(package):
    index = index_words(package)
    assert index, f"{package.relative_to(ROOT)}/__init__.py has no docstring to index it"
    missing = [name for name in members(package)
               if not re.search(rf"(?<![\w.]){re.escape(name.rstrip('/'))}(?![\w])", index)]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py does not name {missing}"


def test_the_architecture_page_names_every_package():
    tree = re.search(r"```text\n(.*?)```", ARCHITECTURE.read_text(encoding="utf-8").split("## Layout", 1)[-1],
                     flags=re.S)
    assert tree, "docs/architecture.md has no Layout section with a text tree"
    for package in packages():
        name = package.name + "/"
        assert name in tree[1], f"the layout tree in docs/architecture.md does not name {name}"


def test_tests_mirror_the_subpackages_they_test():
    """A subpackage of seq2seq, variants or benchmarks with tests has them in a folder of its name."""
    for top in ("seq2seq", "variants", "benchmarks"):
        for package in sorted((ROOT / top).glob("*/__init__.py")):
            name = package.parent.name
            mirror = ROOT / "tests" / top / name
            flat = sorted((ROOT / "tests" / top).glob(f"test_{name}*.py"))
            assert mirror.is_dir() or not flat, f"tests of {top}/{name}/ lie flat: {[p.name for p in flat]}"
