"""Measured tables cannot go stale: a table a script regenerates equals what the script prints,
on the page that holds it; the current results table shows what its raw report holds, and the
README's results table quotes it row for row."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.docs.pages import DOCS, ROOT, fenced_block, section, table_rows

BENCHMARKS_PAGE = DOCS / "benchmarks.md"
CURRENT_REPORT = DOCS / "results" / "cpu-base-f32.json"


def ratio_form(key: str):
    """A ratio as the table writes it: ``0.97x [0.95, 0.99]``, with a leading ≈ where the report
    says it is not told apart from torch's (its ``key_resolved`` is false; torch's own is 1)."""
    def form(result: dict) -> str:
        same = "≈" if result.get(f"{key}_resolved") is False and result["variant"] != "torch" else ""
        return f"{same}{result[key]:.2f}x [{result[key + '_low']:.2f}, {result[key + '_high']:.2f}]"
    return form


def value_form(key: str, pattern: str):
    return lambda result: pattern.format(result[key])


# The current results table's columns after the variant, each as the report's row is written
# there (ms to one decimal, ratios with their interval, shares as 54%, differences as 1.9e-06).
CURRENT_COLUMNS = (value_form("forward_ms", "{:.1f}"), ratio_form("forward_vs_torch"),
                   value_form("train_ms", "{:.1f}"), ratio_form("train_vs_torch"),
                   value_form("train_pct_peak", "{:.0f}%"), value_form("max_abs_dlogp", "{:.1e}"))
VARIANT_ROWS = ("explicit", "einsum", "mathfirst", "fused", "torch")


def current_results() -> tuple[str, list[str]]:
    """The command and the table rows under the benchmarks page's Current results."""
    text = section("Current results", BENCHMARKS_PAGE)
    return fenced_block(text, "bash").strip(), table_rows(text, "variant")


def test_readme_results_quote_the_current_table():
    """The README's results table is the benchmarks page's current table, row for row, and
    names the same command."""
    readme = section("Results")
    command, rows = current_results()
    assert command.startswith("python compare.py")
    assert fenced_block(readme, "bash").strip() == command
    assert table_rows(readme, "variant") == rows


def test_current_table_shows_its_raw_report():
    """Each cell of the current table is the raw report's value for that row, one value per
    block (joined by " / " when there are several), rounded as the column writes it; the
    command is the report's."""
    command, rows = current_results()
    assert [row.split("|")[1].strip() for row in rows] == list(VARIANT_ROWS)
    assert CURRENT_REPORT.is_file(), (
        f"{CURRENT_REPORT.relative_to(ROOT)} is missing: run the command under Current results")
    report = json.loads(CURRENT_REPORT.read_text(encoding="utf-8"))
    assert command == f"python {report['meta']['command']}"
    blocks = report["blocks"]
    assert [block["dtype"] for block in blocks] == ["float32"] * len(blocks)
    for row in rows:
        variant, *cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        measured = [next(r for r in block["rows"] if r["variant"] == variant) for block in blocks]
        expected = [" / ".join(form(result) for result in measured) for form in CURRENT_COLUMNS]
        assert cells == expected, f"the {variant} row differs from {CURRENT_REPORT.name}"


def cells(text: str) -> list[tuple[str, ...]]:
    """Each Markdown table row of ``text`` as its stripped cells: what a row says, not how one
    tabulate release pads its columns."""
    return [tuple(cell.strip() for cell in line.strip().strip("|").split("|"))
            for line in text.splitlines() if line.startswith("| ")]


def assert_section_shows(printed: str, page_section: str) -> None:
    """Every table row of ``printed`` stands in that page section (cell for cell)."""
    rows, shown = cells(printed), set(cells(page_section))
    assert len(rows) > 4
    for row in rows:
        assert row in shown, f"the table lacks or differs on:\n{row}"


def assert_page_shows(script: str, page_section: str) -> None:
    """Every table row that ``python -m scripts.<script>`` prints stands in that page section."""
    printed = subprocess.run([sys.executable, "-m", f"scripts.{script}"], cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=600).stdout
    assert_section_shows(printed, page_section)


@pytest.mark.slow  # regenerates every deviation of the table (about 6 s)
def test_deviation_table_matches_the_script():
    assert_page_shows("deviations", section("Deviations from the sources", DOCS / "deviations.md"))


def test_low_precision_table_is_what_the_script_prints_of_its_measurement(monkeypatch, capsys):
    """The table is the script's own output for the cells it records in ``MEASURED``; that
    ``MEASURED`` is what the script measures today is checked by the slow
    tests/equivalence/test_numerics.py::test_the_recorded_measurement_is_what_the_script_measures.
    Together: the page shows a live measurement, measured once per run of the slow tests, not
    twice (each measurement takes minutes)."""
    from benchmarks.studies import low_precision

    def recorded(seeds: int = low_precision.SEEDS):
        assert seeds == low_precision.SEEDS, "the page shows the default seeds"
        return low_precision.MEASURED

    monkeypatch.setattr(low_precision, "measure", recorded)
    assert low_precision.main([]) == 0
    assert_section_shows(capsys.readouterr().out,
                         section("Low precision: measured tolerances", DOCS / "numerics.md"))

