"""``python -m scripts.concept_map`` prints where each concept of the README's concept map lives,
by file and line; every file in scripts/ runs, and the scripts index says who imports what."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from scripts.concept_map import COLUMNS
from scripts.concept_map.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"

README = """# A project

## Concept map

| concept | explicit | einsum | mathfirst | torch reference |
|---|---|---|---|---|
| attention (3.2.1) | [`Attention.forward`](lib/model.py) | [`attend`](lib/model.py) \
| [`attend`](lib/model.py), [`WIDTH`](lib/model.py) | `nn.MultiheadAttention` |

## Next
"""

MODEL = '''WIDTH = 4


def attend(x):
    """Attention (section 3.2.1)."""
    return x


class Attention:
    @staticmethod
    def forward(x):
        return attend(x)
'''


def tiny_project(root: Path) -> None:
    (root / "lib").mkdir()
    (root / "lib" / "model.py").write_text(MODEL, encoding="utf-8")
    (root / "README.md").write_text(README, encoding="utf-8")


def test_the_listing_names_each_symbol_by_file_and_lines(tmp_path, capsys):
    tiny_project(tmp_path)
    assert main([], root=tmp_path) == 0
    assert capsys.readouterr().out == (
        "attention (3.2.1)\n"
        "  explicit:        lib/model.py:10-12 Attention.forward\n"
        "  einsum:          lib/model.py:4-6 attend\n"
        "  mathfirst:       lib/model.py:4-6 attend\n"
        "                   lib/model.py:1-1 WIDTH\n"
        "  torch reference: nn.MultiheadAttention\n")


def test_a_link_to_a_symbol_that_moved_is_one_line_and_exit_1(tmp_path, capsys):
    tiny_project(tmp_path)
    moved = MODEL.replace("def attend", "def attend_all")
    (tmp_path / "lib" / "model.py").write_text(moved, encoding="utf-8")
    assert main([], root=tmp_path) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("python -m scripts.concept_map: lib/model.py defines no attend "
                            "(the concept map names it)\n")


def test_the_readme_listing_points_at_the_definitions():
    """Run as users run it: each listed path:first names a line that defines the symbol (read here
    with plain text matching, not with the reader's ast)."""
    printed = subprocess.run([sys.executable, "-m", "scripts.concept_map"], cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=120).stdout
    located = re.findall(r"(\S+\.py):(\d+)-(\d+) ([\w.]+)$", printed, flags=re.M)
    assert len(located) > 30
    for path, first, last, name in located:
        lines = (ROOT / path).read_text(encoding="utf-8").splitlines()[int(first) - 1:int(last)]
        last_name = name.rsplit(".", 1)[-1]
        assert any(re.match(rf"\s*(def|class) {last_name}\b|\s*{last_name}\b.*=", line) for line in lines), (
            f"{path}:{first}-{last} does not define {name}")
    titles = [line for line in printed.splitlines() if not line.startswith(" ")]
    assert len(titles) >= 15
    assert printed.count(f"  {COLUMNS[0]}:") == len(titles)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def runs_itself(path: Path) -> bool:
    return path.name == "__main__.py" or any(
        isinstance(node, ast.If) and re.search(r"__name__\s*==\s*['\"]__main__['\"]", ast.unparse(node.test))
        for node in ast.parse(path.read_text(encoding="utf-8")).body)


def test_every_program_in_scripts_runs_and_only_concept_map_is_a_library():
    """Each module at scripts/'s top runs itself; a subpackage runs through its __main__.py."""
    top = [path for path in SCRIPTS.glob("*.py") if path.name != "__init__.py"]
    assert [path.name for path in top if not runs_itself(path)] == []
    for package in SCRIPTS.glob("*/__init__.py"):
        assert (package.parent / "__main__.py").is_file(), f"{package.parent.name}/ has no __main__.py"
        assert not runs_itself(package), f"{package.parent.name}/__init__.py is the library, not the program"


def test_the_index_names_who_imports_each_module_of_scripts():
    """Within scripts/, a module another imports is the concept map's reader alone, and the
    index names each of its importers."""
    imported: dict[str, set[str]] = {}
    for path in SCRIPTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("scripts."):
                imported.setdefault(node.module, set()).add(module_name(path))
    programs = {name: who - {name + ".__main__"} for name, who in imported.items()}
    assert {name for name, who in programs.items() if who} == {"scripts.concept_map"}
    index = ast.get_docstring(ast.parse((SCRIPTS / "__init__.py").read_text(encoding="utf-8")))
    entry = re.search(r"^    concept_map/.*?(?=^    \w|^\S)", index, flags=re.M | re.S).group(0)
    for importer in programs["scripts.concept_map"]:
        assert importer.removeprefix("scripts.") in entry, f"the index's concept_map entry omits {importer}"
