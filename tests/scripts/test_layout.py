"""docs/architecture.md's layout tree is what ``python -m scripts.layout`` draws from the packages'
indexes, so a package's summary cannot change without the page following; and the drawing itself:
each package's line is the first sentence of its index, subpackages indented under it, long
summaries wrapped under the second column, the fixed lines last."""

from __future__ import annotations

import pytest

from scripts import layout

ROOT = layout.ROOT


def package(path, docstring: str) -> None:
    path.mkdir(parents=True)
    (path / "__init__.py").write_text(f'"""{docstring}"""\n', encoding="utf-8")


def test_the_architecture_page_shows_the_tree_the_code_draws():
    shown = layout.page_tree(ROOT / layout.PAGE)
    assert shown == layout.tree(ROOT), (
        "docs/architecture.md's layout tree differs from the packages' indexes: "
        "run python -m scripts.layout --write")


def test_each_line_is_the_first_sentence_of_a_package_index(tmp_path):
    package(tmp_path / "alpha", "The first room. More words that stay out.\n\nA second paragraph.")
    package(tmp_path / "alpha" / "inner", "Holds ``code`` spans (and an aside (nested)):\n\n    a list")
    package(tmp_path / "alpha" / "inner" / "deep", "Deepest")
    (tmp_path / "alpha" / "data").mkdir()  # a folder without __init__.py is no package
    package(tmp_path / "alpha" / "beta", "Sorted before inner.")
    package(tmp_path / "omega", "Last of the top\npackages, its lines joined.")
    drawn = layout.tree(tmp_path, top=("omega", "alpha"), fixed=(("notes/", "Fixed text"),))
    assert drawn == (
        "omega/         Last of the top packages, its lines joined\n"
        "alpha/         The first room\n"
        "  beta/        Sorted before inner\n"
        "  inner/       Holds `code` spans\n"
        "    deep/      Deepest\n"
        "notes/         Fixed text\n")


def test_a_long_summary_keeps_its_clauses_that_fit_on_one_line():
    opening = "An opening clause, " + "w" * 66  # the 85 characters beside the name column
    assert len(opening) == layout.WIDTH - layout.NAME_WIDTH
    assert layout.summary(opening + "; then more words than fit.") == opening
    assert layout.summary(opening + "s; then more.") == "An opening clause"  # 86 + more: one clause less
    assert layout.summary("Fits exactly " + "x" * 72) == "Fits exactly " + "x" * 72
    with pytest.raises(ValueError, match="no clause of at most 85 characters"):
        layout.summary("y" * 90 + ", z.")


def test_a_package_without_an_index_is_refused_by_name(tmp_path):
    package(tmp_path / "pkg", "Fine.")
    (tmp_path / "pkg" / "bare").mkdir()
    (tmp_path / "pkg" / "bare" / "__init__.py").write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pkg/bare/__init__.py has no docstring"):
        layout.tree(tmp_path, top=("pkg",), fixed=())
    with pytest.raises(ValueError, match=r"missing/ under .* is not a package"):
        layout.tree(tmp_path, top=("missing",), fixed=())


PAGE = """# Title

```text
an earlier block, not the layout
```

## Layout, and more words

Some prose.

```text
old tree
```

## Next

```text
a later block
```
"""


def test_write_replaces_the_layout_block_alone(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE, encoding="utf-8")
    assert layout.write(page, "new\ntree\n") is True
    assert page.read_text(encoding="utf-8") == PAGE.replace("old tree\n", "new\ntree\n")
    assert layout.page_tree(page) == "new\ntree\n"
    assert layout.write(page, "new\ntree\n") is False


@pytest.mark.parametrize(("text", "problem"), [
    ("# Title\n\n```text\nx\n```\n", "no '## Layout' heading"),
    ("## Layout\n\nprose\n\n## Next\n\n```text\nx\n```\n", "no ```text block under '## Layout'"),
])
def test_a_page_without_a_layout_block_is_refused_by_name(tmp_path, text, problem):
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=f"page.md: {problem}"):
        layout.page_tree(page)


def test_the_command_prints_the_tree(capsys):
    assert layout.main([]) == 0
    assert capsys.readouterr().out == layout.tree(ROOT)
