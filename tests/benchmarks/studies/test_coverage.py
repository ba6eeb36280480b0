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
    found = {c.name: c for c in coverage.coverage(RUNS, reference=report((1.12, 0.5, 2), (1.0, 0.5, 2)))}
    assert set(found) == {"explicit forward ×torch", "control forward"}
    explicit, control = found["explicit forward ×torch"], found["control forward"]
    assert (explicit.covered, explicit.runs) == (2, 3) and explicit.misses == ("1.200 [1.160, 1.240]",)
    assert (control.covered, control.runs, control.reference) == (2, 3, 1.0)
    assert explicit.widest == pytest.approx(max(0.05 / 1.10, 0.04 / 1.20, 0.03 / 1.12))


def test_without_a_reference_the_runs_pooled_are_the_truth(monkeypatch):
    pooled = []
    monkeypatch.setattr(coverage, "pool",
                        lambda runs: pooled.append(runs) or report((1.2, 0.5, 2), (1, 0.5, 2)))
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
    for index, run in enumerate([*RUNS, report((1.12, 0.5, 2), (1.0, 0.5, 2))]):
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
    reference.write_text(json.dumps(report((1.12, 0.5, 2), (1.0, 0.5, 2))), encoding="utf-8")
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


def test_the_control_is_held_against_one_not_the_references_control():
    """A reference whose control is steadily biased (1.10): a run's control interval holding 1
    but not 1.10 still covers, and one holding 1.10 but not 1 misses."""
    runs = [report((1.10, 1.05, 1.15), (1.00, 0.98, 1.02)),   # holds 1, not 1.10
            report((1.12, 1.08, 1.16), (1.10, 1.05, 1.15))]   # holds 1.10, not 1
    biased = report((1.12, 1.1, 1.2), (1.10, 1.05, 1.15))
    found = {c.name: c for c in coverage.coverage(runs, reference=biased)}
    control = found["control forward"]
    assert (control.reference, control.covered, control.runs) == (1.0, 1, 2)
    assert control.misses == ("1.100 [1.050, 1.150]",)


def test_the_pooled_control_is_not_the_target_either(monkeypatch):
    runs = [report((1.10, 1.05, 1.15), (1.00, 0.98, 1.02)), report((1.12, 1.08, 1.16), (1.01, 0.97, 1.03))]
    monkeypatch.setattr(coverage, "pool", lambda runs: report((1.11, 1.0, 1.2), (1.2, 1.1, 1.3)))
    control = {c.name: c for c in coverage.coverage(runs)}["control forward"]
    assert (control.reference, control.covered) == (1.0, 2)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "1.1", None, True])
def test_a_ratio_that_is_not_finite_and_positive_is_refused_by_name(bad):
    run = report((1.10, 1.05, 1.15), (1.00, 0.98, 1.02))
    run["blocks"][0]["rows"][0]["forward_vs_torch"] = bad
    if bad is None:  # a row without the ratio has none to check
        assert "explicit forward ×torch" not in coverage.ratios(run)
        return
    with pytest.raises(ValueError, match=r"explicit forward ×torch: its ratio is .*finite positive"):
        coverage.ratios(run)


@pytest.mark.parametrize("end", ["forward_vs_torch_low", "forward_vs_torch_high"])
def test_an_interval_end_of_zero_is_refused_too(end):
    run = report((1.10, 1.05, 1.15), (1.00, 0.98, 1.02))
    run["blocks"][0]["control"][end] = 0
    with pytest.raises(ValueError, match="control forward: its interval's"):
        coverage.ratios(run)


def test_runs_with_different_rows_are_refused_naming_them():
    other = report((1.10, 1.05, 1.15), (1.00, 0.98, 1.02))
    other["blocks"][0]["rows"].insert(0, {"variant": "fused"})
    with pytest.raises(ValueError, match=r"run 2 has the rows fused, explicit, torch, but run 1 has "
                                         r"explicit, torch"):
        coverage.coverage([RUNS[0], other])
    lacking = report((1.10, 1.05, 1.15), (1.00, 0.98, 1.02))
    del lacking["blocks"][0]["control"]
    with pytest.raises(ValueError, match=r"run 3 does not hold the ratios of run 1: it lacks control "):
        coverage.coverage([RUNS[0], RUNS[1], lacking])
    with pytest.raises(ValueError, match=r"the reference does not hold .* lacks control forward"):
        coverage.coverage(RUNS, reference=lacking)


def write(path, value):
    path.write_text(json.dumps(value), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("content", "said"), [
    ("", "is empty"), ('{"blocks": [', "is not JSON"), ('"a report"', "holds a JSON string"),
    ("3", "holds a JSON number"), ("null", "holds a JSON null"), ("[1, 2, 3]", "run 1 of its list is not a"),
    ("[]", "holds an empty list"), ('{"meta": {}, "blocks": []}', "no 'blocks' list"),
])
def test_a_file_that_is_not_a_report_is_one_line_naming_it(tmp_path, capsys, content, said):
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    good = write(tmp_path / "good.json", RUNS)
    for argv in ([str(bad), good], [good, "--reference", str(bad)]):
        assert coverage.main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(bad) in err and said in err


def test_a_zero_ratio_in_a_file_is_one_line_naming_the_file_and_the_ratio(tmp_path, capsys):
    zero = report((0.0, 1.05, 1.15), (1.00, 0.98, 1.02))
    path = write(tmp_path / "zero.json", [RUNS[0], zero])
    assert coverage.main([path, write(tmp_path / "ok.json", RUNS[1])]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "zero.json: run 2 of its list explicit forward ×torch: its ratio is 0.0" in err


def test_the_reference_may_be_a_list_of_runs_which_is_pooled(tmp_path, capsys, monkeypatch):
    pooled = []
    monkeypatch.setattr(coverage, "pool", lambda runs: pooled.append(runs) or report((1.12, 1.1, 1.2),
                                                                                       (1.0, 0.9, 1.1)))
    reference = write(tmp_path / "reference.json", RUNS[:2])
    assert coverage.main([write(tmp_path / "runs.json", RUNS), "--reference", reference]) == 0
    assert pooled == [RUNS[:2]]
    assert "| explicit forward ×torch | 1.120" in capsys.readouterr().out
