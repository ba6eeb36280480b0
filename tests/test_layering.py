"""Imports run one way: common <- variants <- seq2seq <- benchmarks <- {scripts, compare.py} <- tests.

Every module outside ``tests/`` is parsed (not imported) and each of its project imports,
top-level or inside a function, must point at its own layer or one below. Above ``variants``
a model is reached only through the registry (``variants.build``), never a variant's module.
Inside a layer, module imports form no circle. Below the imports, no module uses another
package's private names (``test_no_private_name_crosses_a_package``).
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
    ("common", "def f():\n    from seq2seq.search.greedy import greedy_decode",
     "common may not import seq2seq"),
    ("variants/explicit", "from variants.einsum.model import Transformer", "no variant imports another"),
    ("seq2seq", "from variants.mathfirst import components", "use variants.build"),
    ("seq2seq", "import benchmarks.compare.timing", "seq2seq may not import benchmarks"),
    ("scripts", "from tests.helpers import small_config", "scripts may not import tests"),
    ("scripts", "from compare import main", "scripts may not import compare"),
    ("benchmarks", "from compare import main", "benchmarks may not import compare"),
    ("benchmarks", "from scripts.trace import main", "benchmarks may not import scripts"),
    ("seq2seq", "from scripts.trace import main", "seq2seq may not import scripts"),
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


# --- private names stay in their package ------------------------------------------------------


def package_of(path: Path, root: Path) -> str:
    """The dotted package a module belongs to: its folder (``seq2seq.deploy``), or the module's own
    name for a top-level file (``compare``)."""
    relative = path.relative_to(root)
    return ".".join(relative.parent.parts) if len(relative.parts) > 1 else relative.stem


def private_definitions(paths: list[Path], root: Path) -> dict[str, set[str]]:
    """Each private name a module defines (``def _x``, ``class _X``, ``_X = ...`` at its top
    level) -> the packages that define it."""
    found: dict[str, set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [node.name for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        names += [target.id for node in tree.body if isinstance(node, ast.Assign)
                  for target in node.targets if isinstance(target, ast.Name)]
        for name in names:
            if is_private(name):
                found.setdefault(name, set()).add(package_of(path, root))
    return found


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_crossings(path: Path, definitions: dict[str, set[str]], root: Path = ROOT) -> list[str]:
    """Every use in ``path`` of a private name that belongs to another package, as
    'file:line uses name (why)'.

    What counts, read from the syntax alone (no types are known):

    - ``from X import _y`` where X is a project module outside the importing module's package
      (a subpackage is a package of its own: ``seq2seq.training`` is not ``seq2seq.deploy``);
    - ``m._y`` (called or not) where ``m`` is a name this module imported from a project module
      of another package (``from common import checks; checks._check_ids(...)``);
    - a call ``obj._y(...)`` on any other object, where ``_y`` is defined somewhere in the project
      and not in this module's own package (``self.model._encode(...)`` from seq2seq.deploy).

    Not counted: dunder names (``__init__``); ``self._y`` and ``cls._y`` and ``super()._y``
    (a class's own); names the project does not define (torch's own privates such as
    ``torch._dynamo`` are torch's business, not this contract's); ``tests/``, which may reach
    inside what it tests.
    """
    where = path.relative_to(root)
    own = package_of(path, root)
    modules: dict[str, str] = {}  # local name -> the project module it is bound to
    problems = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    modules[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in PROJECT:
            for alias in node.names:
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                if is_private(alias.name) and not in_package(node.module, own):
                    problems.append(f"{where}:{node.lineno} uses {node.module}.{alias.name} "
                                    f"(from {own}, a private name of another package)")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in modules:
            module = modules[base.id]
            if not in_package(module, own) and not in_package(module.rsplit(".", 1)[0], own):
                problems.append(f"{where}:{node.lineno} uses {module}.{node.attr} "
                                f"(from {own}, a private name of another package)")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, base = node.func.attr, node.func.value
        if not is_private(name) or name not in definitions or own in definitions[name]:
            continue
        if isinstance(base, ast.Name) and (base.id in ("self", "cls") or base.id in modules):
            continue  # a class's own, or a module attribute (counted above)
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            continue
        problems.append(f"{where}:{node.lineno} calls {ast.unparse(node.func)} "
                        f"(from {own}, a private method of {', '.join(sorted(definitions[name]))})")
    return problems


def in_package(module: str, package: str) -> bool:
    """Whether the dotted ``module`` is ``package`` itself or one of its modules (not a subpackage's)."""
    return module == package or module.rsplit(".", 1)[0] == package


def test_no_private_name_crosses_a_package():
    modules = project_modules()
    definitions = private_definitions(modules, ROOT)
    assert [problem for path in modules for problem in private_crossings(path, definitions)] == []


@pytest.mark.parametrize(("where", "source", "complaint"), [
    ("seq2seq/deploy", "from common.checks import _check_ids", "uses common.checks._check_ids"),
    ("seq2seq/deploy", "from common import checks\nchecks._check_mask(None)",
     "uses common.checks._check_mask"),
    ("seq2seq/deploy", "import common.checks\ncommon.checks._check_ids(1)", "calls common.checks._check_ids"),
    ("seq2seq/deploy", "def f(model):\n    return model._encode(1, None)", "calls model._encode"),
    ("seq2seq", "from seq2seq.storage.model_file import _digest",
     "uses seq2seq.storage.model_file._digest"),
    ("benchmarks", "def f(fused):\n    fused.export._project(1)", "calls fused.export._project"),
])
def test_a_private_crossing_is_caught(tmp_path, where, source, complaint):
    """The check itself: a planted private use in a throwaway tree is reported, beside a module
    of the package that defines the names, whose own uses are not."""
    defining = {
        "common/checks.py": "def _check_ids(x): pass\ndef _check_mask(x): pass\n",
        "variants/fused/model.py": "class T:\n    def _encode(self, a, b): return self._project(a)\n"
                                   "    def _project(self, a): return a\n",
        "seq2seq/storage/model_file.py": "def _digest(x): return x\n",
    }
    for name, text in defining.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    module = tmp_path / where / "planted.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(source + "\n", encoding="utf-8")
    paths = sorted(tmp_path.rglob("*.py"))
    definitions = private_definitions(paths, tmp_path)
    problems = [problem for path in paths for problem in private_crossings(path, definitions, tmp_path)]
    assert len(problems) == 1 and complaint in problems[0] and "planted.py" in problems[0], problems


def test_a_private_use_inside_its_own_package_is_allowed(tmp_path):
    package = tmp_path / "seq2seq" / "deploy"
    package.mkdir(parents=True)
    (package / "a.py").write_text("def _helper(x): return x\nclass C:\n    def _m(self): return 1\n",
                                  encoding="utf-8")
    (package / "b.py").write_text("from seq2seq.deploy.a import _helper, C\n"
                                  "def f(c):\n    return _helper(c._m())\n", encoding="utf-8")
    paths = sorted(tmp_path.rglob("*.py"))
    definitions = private_definitions(paths, tmp_path)
    assert [problem for path in paths for problem in private_crossings(path, definitions, tmp_path)] == []


# --- fences: what only some modules may import --------------------------------------------------


def is_program(path: Path) -> bool:
    """A command: a ``__main__.py``, or a module that runs itself (``if __name__ == "__main__":``)."""
    if path.name == "__main__.py":
        return True
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        test = ast.unparse(node.test) if isinstance(node, ast.If) else ""
        if "__name__" in test and "__main__" in test:
            return True
    return False


def top_level_imports(path: Path) -> set[int]:
    """The line numbers of the import statements at a module's top level (not inside a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.lineno for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)}


def fence_violations(path: Path, programs: set[str], root: Path = ROOT) -> list[str]:
    """Every import in ``path`` that crosses a fence, as 'file:line imports x (why)':

    - a program (a command) is a leaf: no module imports one (tests aside, which run them);
    - the checker (``variants.check``) is loaded only when asked for: nothing outside it imports
      it, but the registry (``variants/__init__.py``), and that only inside a function;
    - the teaching decoders (``seq2seq.search``) never import the fast path (``seq2seq.fast``);
    - benchmarks/ has three rooms: a study (``benchmarks.studies``) may use compare.py's engine
      (``benchmarks.compare``) and the engine rows (``benchmarks.engines``), which no study
      reaches back into; the engine rows time the same steps as every row (``compare.steps``)
      and use nothing else of compare.py's engine; compare.py imports compare.py's engine alone.
    """
    where = path.relative_to(root)
    name = module_name(path, root)
    top = top_level_imports(path)
    problems = []
    for line, names in project_imports(path):
        for target in names:
            if target in programs and target != name:
                problems.append(f"{where}:{line} imports {target} (a program is a leaf)")
            elif (target == "variants.check" or target.startswith("variants.check.")) \
                    and not name.startswith("variants.check"):
                if name != "variants" or line in top:
                    problems.append(f"{where}:{line} imports {target} (the checker loads only when "
                                    "asked for)")
            elif target.startswith("seq2seq.fast") and name.startswith("seq2seq.search"):
                problems.append(f"{where}:{line} imports {target} (the teaching decoders stay off the "
                                "fast path)")
            elif why := room_crossing(name, target):
                problems.append(f"{where}:{line} imports {target} ({why})")
            else:
                continue
            break
    return problems


def room_crossing(name: str, target: str) -> str | None:
    """Why ``name`` may not import ``target`` across benchmarks/' rooms, or None."""
    if not target.startswith("benchmarks."):
        return None
    room = target.split(".")[1]
    if name == "compare" and room != "compare":
        return "compare.py imports compare.py's engine alone"
    if name.startswith(("benchmarks.compare", "benchmarks.engines")) and room == "studies":
        return "a study is a leaf of benchmarks/"
    if name.startswith("benchmarks.engines") and room == "compare" \
            and not target.startswith("benchmarks.compare.steps"):
        return "the engine rows use compare.py's timed steps and nothing else of it"
    return None


# Not commands: a library module's entry for the child interpreters it starts itself.
WORKERS = {"benchmarks.compare.processes"}  # run_processes starts `python -m benchmarks.compare.processes`


def programs_of(paths: list[Path], root: Path) -> set[str]:
    """The dotted names of the commands among ``paths``."""
    return {module_name(path, root) for path in paths if is_program(path)} - WORKERS


@pytest.fixture(scope="module")
def project_programs() -> set[str]:
    """The project's commands, read once for every module's fence check."""
    return programs_of(project_modules(), ROOT)


@pytest.mark.parametrize("path", project_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_fences_hold(path, project_programs):
    assert fence_violations(path, project_programs) == []


@pytest.mark.parametrize(("where", "source", "complaint"), [
    ("benchmarks/compare/run.py", "from benchmarks.studies.gemm_paths import main", "a program is a leaf"),
    ("seq2seq/pipeline.py", "from variants.check.battery import run_battery", "the checker loads"),
    ("variants/__init__.py", "from variants.check.outside import build_outside", "the checker loads"),
    ("seq2seq/search/greedy.py", "from seq2seq.fast.onednn import with_onednn_linears",
     "off the fast path"),
    ("benchmarks/engines/rows.py", "from benchmarks.compare.run import run", "nothing else of it"),
    ("benchmarks/compare/run.py", "from benchmarks.studies.breakdown import breakdown", "a leaf of"),
    ("compare.py", "from benchmarks.engines.rows import engine_rows", "engine alone"),
])
def test_a_fence_crossing_is_caught(tmp_path, where, source, complaint):
    """The check itself: a planted crossing in a throwaway tree is reported, and the registry's
    import of the checker inside a function is not."""
    program = tmp_path / "benchmarks" / "studies" / "gemm_paths.py"
    program.parent.mkdir(parents=True)
    program.write_text('def main(): pass\nif __name__ == "__main__":\n    main()\n', encoding="utf-8")
    module = tmp_path / where
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(source + "\n", encoding="utf-8")
    programs = programs_of([program, module], tmp_path)
    problems = fence_violations(module, programs, tmp_path)
    assert len(problems) == 1 and complaint in problems[0], problems
    module.write_text("def build():\n    " + source + "\n", encoding="utf-8")
    if where == "variants/__init__.py":
        assert fence_violations(module, programs, tmp_path) == []
