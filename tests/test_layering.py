"""Imports run one way: common <- variants <- seq2seq <- benchmarks <- {scripts, compare.py} <- tests.

Every module outside ``tests/`` is parsed (not imported) and each of its project imports,
top-level or inside a function, must point at its own layer or one below. Above ``variants``
a model is reached only through the registry (``variants.build``), never a variant's module.
Inside a layer, module imports form no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("common", "variants", "seq2seq", "benchmarks", "scripts", "compare", "tests")
VARIANT_PACKAGES = ("explicit", "einsum", "mathfirst", "fused")

# layer -> the project layers it may import from (itself included)
ALLOWED = {
    "common": {"common"},
    "variants": {"common", "variants"},
    "seq2seq": {"common", "variants", "seq2seq"},
    "benchmarks": {"common", "variants", "seq2seq", "benchmarks"},
    "scripts": {"common", "variants", "seq2seq", "benchmarks", "scripts"},  # a leaf
    "compare": {"common", "variants", "seq2seq", "benchmarks"},  # a leaf
}


def layer_of(path: Path, root: Path) -> str:
    relative = path.relative_to(root)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def project_imports(path: Path) -> list[tuple[int, list[str]]]:
    """(line, dotted names) for each import statement of a project module, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from variants import explicit` imports the module variants.explicit
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        names = [name for name in names if name.split(".")[0] in PROJECT]
        if names:
            found.append((node.lineno, names))
    return found


def violation(layer: str, own_package: str, name: str) -> str | None:
    """Why importing ``name`` from ``layer`` breaks the layering, or None if it does not."""
    parts = name.split(".")
    target = parts[0]
    if target not in ALLOWED[layer]:
        return f"{layer} may not import {target}"
    variant = parts[1] if target == "variants" and len(parts) > 1 else None
    if layer == "variants" and variant in VARIANT_PACKAGES and variant != own_package:
        return "no variant imports another"
    if layer != "variants" and variant in (*VARIANT_PACKAGES, "reference"):
        return "above variants/, use variants.build"
    return None


def wrong_way(path: Path, root: Path = ROOT) -> list[str]:
    """Every import statement in ``path`` that breaks the layering, as 'file:line imports x (why)'."""
    where = path.relative_to(root)
    layer = layer_of(path, root)
    own_package = where.parts[1] if len(where.parts) > 2 else ""
    problems = []
    for line, names in project_imports(path):
        for name in names:
            why = violation(layer, own_package, name)
            if why:
                problems.append(f"{where}:{line} imports {name} ({why})")
                break  # one complaint per statement
    return problems


def project_modules() -> list[Path]:
    files = [ROOT / "compare.py"]
    for package in PROJECT[:-2]:
        files += sorted((ROOT / package).rglob("*.py"))
    return files


@pytest.mark.parametrize("path", project_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    assert wrong_way(path) == []


@pytest.mark.parametrize(("layer", "source", "complaint"), [
    ("common", "from variants import build", "common may not import variants"),
    ("common", "def f():\n    from seq2seq.decoding.greedy import greedy_decode", "common may not import seq2seq"),
    ("variants/explicit", "from variants.einsum.model import Transformer", "no variant imports another"),
    ("seq2seq", "from variants.mathfirst import components", "use variants.build"),
    ("seq2seq", "import benchmarks.timing", "seq2seq may not import benchmarks"),
    ("scripts", "from tests.helpers import small_config", "scripts may not import tests"),
    ("scripts", "from compare import main", "scripts may not import compare"),
    ("benchmarks", "from compare import main", "benchmarks may not import compare"),
    ("benchmarks", "from scripts.trace import main", "benchmarks may not import scripts"),
    ("seq2seq", "from scripts.decode_scan import scan", "seq2seq may not import scripts"),
])
def test_an_upward_import_is_caught(tmp_path, layer, source, complaint):
    """The check itself: a planted wrong-way import in a throwaway tree is reported."""
    module = tmp_path / layer / "planted.py"
    module.parent.mkdir(parents=True)
    module.write_text(source + "\n", encoding="utf-8")
    problems = wrong_way(module, root=tmp_path)
    assert len(problems) == 1 and complaint in problems[0], problems


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycle(paths: list[Path], root: Path = ROOT) -> list[str]:
    """One circle of module imports among ``paths`` (as module names, first repeated last), or []."""
    modules = {module_name(path, root): path for path in paths}
    edges = {}
    for name, path in modules.items():
        targets = {target for _, names in project_imports(path) for target in names}
        # `from pkg import mod` names pkg.mod; keep only the names that are modules here
        edges[name] = sorted(target for target in targets if target in modules and target != name)
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> list[str]:
        if name in trail:
            return [*trail[trail.index(name):], name]
        if name in done:
            return []
        for target in edges[name]:
            cycle = visit(target, [*trail, name])
            if cycle:
                return cycle
        done.add(name)
        return []

    for name in sorted(modules):
        cycle = visit(name, [])
        if cycle:
            return cycle
    return []


def test_no_module_imports_itself_in_a_circle():
    assert import_cycle(project_modules()) == []


def test_a_circle_is_caught(tmp_path):
    """The check itself: a planted circle of three modules in a throwaway tree is found."""
    package = tmp_path / "seq2seq"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    for module, target in [("a", "b"), ("b", "c"), ("c", "a")]:
        (package / f"{module}.py").write_text(f"from seq2seq.{target} import thing\n", encoding="utf-8")
    assert import_cycle(sorted(package.glob("*.py")), root=tmp_path) == [
        "seq2seq.a", "seq2seq.b", "seq2seq.c", "seq2seq.a"]
