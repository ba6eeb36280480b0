"""The README's front page stays short, its set-up is what CI runs, and its quick start runs."""

from __future__ import annotations

import ast

from tests.docs.pages import README, ROOT, section

README_LIMIT = 15_000  # bytes


def test_readme_is_short():
    assert len(README.encode("utf-8")) <= README_LIMIT, "README.md is over 15,000 bytes: move detail to docs/"


def test_set_up_is_what_ci_runs():
    """The README's set-up block is exactly the commands .ci/run runs after its preamble."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [line for line in ci if line and not line.startswith(("#", "set ", "cd "))]
    block = section("Set-up").split("```bash\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() == commands == ['pip install -e ".[dev,plot,translate,deploy,hf]"',
                                              "python -m pytest", "python -m pytest -m slow"]


def test_quick_start_runs_and_the_two_variants_agree():
    code = section("Quick start").split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {"print": lambda *args: None}
    exec(code, namespace)
    assert namespace["a"].shape == (2, 7, 100)
    assert (namespace["a"] - namespace["b"]).abs().max() < 1e-5


def test_quick_start_imports_only_what_it_uses():
    tree = ast.parse(section("Quick start").split("```python\n", 1)[1].split("```", 1)[0])
    imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names}
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert imported <= used, f"the quick start imports and never uses {sorted(imported - used)}"
