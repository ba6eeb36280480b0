"""benchmarks.studies.coverage counts, per ratio, the runs whose interval holds the reference (1 for
the control), from reports written here by hand."""

from __future__ import annotations

import json

import pytest

from benchmarks.studies import coverage
from tests.benchmarks.compare.test_busy_cores import report_with


def report(explicit_fwd: tuple[float, float, float], control_fwd: tuple[float, float, float]) -> dict:
    value, low, high = explicit_fwd
    c_value, c_low, c_high = control_fwd
    rows = [{"variant": "explicit", "forward_vs_torch": value, "forward_vs_torch_low": low,
             "forward_vs_torch_high": high},
            {"variant": "torch", "forward_vs_torch": 1.0, "forward_vs_torch_low": 1.0,
             "forward_vs_torch_high": 1.0}]
    control = {"forward_vs_torch": c_value, "forward_vs_torch_low": c_low, "forward_vs_torch_high": c_high}
    return {"meta": {}, "blocks": [{"rows": rows, "control": control}]}


RUNS = [report((1.10, 1.05, 1.15), (1.00, 0.98, 1.02)),
        report((1.20, 1.16, 1.24), (1.07, 1.02, 1.12)),  # misses 1.12, and its control misses 1
        report((1.12, 1.08, 1.14), (0.99, 0.95, 1.01))]


def test_each_interval_is_counted_against_the_reference_and_the_control_against_one():
    found = {c.name: c for c in coverage.coverage(RUNS, reference=report((1.12, 0, 2), (1.0, 0, 2)))}
    assert set(found) == {"explicit forward ×torch", "control forward"}
    explicit, control = found["explicit forward ×torch"], found["control forward"]
    assert (explicit.covered, explicit.runs) == (2, 3) and explicit.misses == ("1.200 [1.160, 1.240]",)
    assert (control.covered, control.runs, control.reference) == (2, 3, 1.0)
    assert explicit.widest == pytest.approx(max(0.05 / 1.10, 0.04 / 1.20, 0.03 / 1.12))


def test_without_a_reference_the_runs_pooled_are_the_truth(monkeypatch):
    pooled = []
    monkeypatch.setattr(coverage, "pool", lambda runs: pooled.append(runs) or report((1.2, 0, 2), (1, 0, 2)))
    found = {c.name: c for c in coverage.coverage(RUNS)}
    assert pooled == [RUNS]
    assert found["explicit forward ×torch"].covered == 1  # only the second run holds 1.2


def test_one_run_is_refused_and_the_command_says_so_in_one_line(tmp_path, capsys):
    with pytest.raises(ValueError, match="at least two runs"):
        coverage.coverage(RUNS[:1])
    path = tmp_path / "one.json"
    path.write_text(json.dumps(RUNS[0]), encoding="utf-8")
    assert coverage.main([str(path)]) == 1
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_the_command_prints_the_table(tmp_path, capsys):
    paths = []
    for index, run in enumerate([*RUNS, report((1.12, 0, 2), (1.0, 0, 2))]):
        paths.append(tmp_path / f"{index}.json")
        paths[-1].write_text(json.dumps(run), encoding="utf-8")
    assert coverage.main([str(p) for p in paths[:3]] + ["--reference", str(paths[3])]) == 0
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows[0][:3] == ["explicit forward ×torch", "1.120", "2/3"]
    assert rows[1][:3] == ["control forward", "1.000", "2/3"]


def test_a_file_may_hold_a_list_of_runs(tmp_path, capsys):
    runs, reference = tmp_path / "runs.json", tmp_path / "reference.json"
    runs.write_text(json.dumps(RUNS), encoding="utf-8")
    reference.write_text(json.dumps(report((1.12, 0, 2), (1.0, 0, 2))), encoding="utf-8")
    assert coverage.main([str(runs), "--reference", str(reference)]) == 0
    assert "2/3" in capsys.readouterr().out


def test_recompute_reads_each_run_again_from_its_rounds():
    """Two runs whose rounds say explicit is 1.3x torch but whose printed ratio (as an earlier
    statistic left it, say) is 2.0 [1.9, 2.1]: as printed neither holds the pooled 1.3; made again
    from their rounds, both do."""
    torch_rounds = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    runs = []
    for seed in (0, 1):
        run = report_with({"explicit": {"forward": [1.3 * t for t in torch_rounds]},
                           "torch": {"forward": torch_rounds}})
        run["blocks"][0]["rounds"] = {"orders": [["explicit", "torch"]] * 6, "seed": seed,
                                      "others": [0.0] * 6, "contended": [False] * 6}
        row = run["blocks"][0]["rows"][0]
        row["forward_vs_torch"], row["forward_vs_torch_low"], row["forward_vs_torch_high"] = 2.0, 1.9, 2.1
        runs.append(run)
    as_printed = {c.name: c for c in coverage.coverage(runs)}["explicit forward ×torch"]
    again = {c.name: c for c in coverage.coverage(runs, recompute=True)}["explicit forward ×torch"]
    assert as_printed.reference == pytest.approx(1.3) and as_printed.covered == 0
    assert again.covered == 2 and again.widest < 0.01
