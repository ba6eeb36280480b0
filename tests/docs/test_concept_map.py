"""The README's concept map goes from a concept of the paper to its implementation in each
variant: every row has a cell per variant, every link names a symbol its file defines, and the
attention rows name functions that make the calls their style is known by."""

from __future__ import annotations

import pytest

from tests.docs.pages import LINK, ROOT, called_names, defined_names, function_node, section

CONCEPT_MAP = section("Concept map")
CONCEPT_LINKS = sorted(set(LINK.findall(CONCEPT_MAP)))
VARIANT_COLUMNS = ("explicit", "einsum", "mathfirst")  # the cells after the concept, in order
# What each style's attention is written with; a cell passes when one function it links makes
# every call of one of these sets.
STYLE_CALLS = {
    "explicit": [{"view", "transpose"}],
    "einsum": [{"einsum"}],
    "mathfirst": [{"rearrange"}, {"einsum"}],
}
ATTENTION_ROWS = ("head split and merge", "scaled dot-product attention")


def concept_rows() -> list[str]:
    return [line for line in CONCEPT_MAP.splitlines()
            if line.startswith("| ") and not line.startswith("| concept")]


def row_cells(concept: str) -> list[str]:
    """The cells of the concept map's row for ``concept``, the concept cell first."""
    rows = [row for row in concept_rows() if row.startswith(f"| {concept} ")]
    assert len(rows) == 1, f"the concept map has {len(rows)} rows for {concept!r}"
    return rows[0].strip("|").split("|")


def test_concept_map_has_a_row_per_concept_and_a_link_per_variant():
    rows = concept_rows()
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


@pytest.mark.parametrize("variant", VARIANT_COLUMNS)
@pytest.mark.parametrize("concept", ATTENTION_ROWS)
def test_attention_cells_name_a_function_that_makes_the_styles_calls(concept, variant):
    cell = row_cells(concept)[1 + VARIANT_COLUMNS.index(variant)]
    named = LINK.findall(cell)
    assert named, f"the {variant} cell of {concept!r} links no function"
    calls_by_function = {}
    for symbol, path in named:
        node = function_node(ROOT / path, symbol)
        if node is not None:  # a class or a module-level name makes no calls of its own
            calls_by_function[f"{path}::{symbol}"] = called_names(node)
    assert calls_by_function, f"the {variant} cell of {concept!r} names no function: {named}"
    wanted = STYLE_CALLS[variant]
    assert any(calls >= required for calls in calls_by_function.values() for required in wanted), (
        f"no function in the {variant} cell of {concept!r} calls "
        f"{' or '.join(' and '.join(sorted(required)) for required in wanted)}: "
        + "; ".join(f"{name} calls {sorted(calls)}" for name, calls in calls_by_function.items()))
