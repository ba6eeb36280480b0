"""Ratios paired by round with their bootstrap interval, the shuffled order of each round, the
control row, and how the table says which ratios it can tell apart from 1. No timing is
asserted: the rounds are made up, and the expected values are computed here."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import statistics

import numpy as np
import pytest
import torch
from scipy import stats

import benchmarks.compare.run
from benchmarks.compare.processes import pool
from benchmarks.compare.ratios import paired_ratio, round_orders
from benchmarks.compare.render import SAME_MARK, render
from benchmarks.compare.run import CONTROL, Block, build_rows, run, time_rounds
from common.weights import export_weights
from tests.benchmarks.compare.test_busy_cores import BUSY_CORES, report_with, table_cells
from tests.benchmarks.compare.test_compare import FAST, run_compare, tiny_settings
from variants import REFERENCE

# --- the statistic and its interval -------------------------------------------------------------


def log_median(ratios: list[float]) -> float:
    """The median of ``ratios`` taken on their logarithms (an even count: the geometric mean of
    the middle two), by the standard library."""
    return math.exp(statistics.median(map(math.log, ratios)))


def test_a_paired_ratio_is_the_median_of_the_rounds_ratios():
    found = paired_ratio([2.0, 8.0, 4.5], [1.0, 2.0, 3.0])  # ratios 2, 4, 1.5
    assert found.value == pytest.approx(2.0)
    assert found.rounds == 3 and found.low <= found.value <= found.high
    even = paired_ratio([2.0, 8.0, 3.0, 3.0], [1.0, 2.0, 3.0, 1.0])  # ratios 2, 4, 1, 3
    assert even.value == pytest.approx(math.sqrt(2 * 3))


def test_one_disturbed_round_does_not_move_the_ratio():
    """Eleven rounds near 1.05 and one that another program slowed to 1.6x: the ratio stays
    the steady rounds' median, where their geometric mean would move by log(1.6) / 12 (4%)."""
    steady = (1.05 * np.exp(np.linspace(-0.01, 0.01, 11))).tolist()
    found = paired_ratio([*steady, 1.6], [1.0] * 12)
    assert found.value == pytest.approx(log_median([*steady, 1.6]))
    assert found.value == pytest.approx(1.05, rel=0.002)
    assert math.exp(statistics.mean(map(math.log, [*steady, 1.6]))) > 1.05 * 1.03  # a mean would not
    assert found.high < 1.08


def test_the_interval_is_the_medians_order_statistic_interval_on_a_spread_sample():
    """40 rounds whose log-ratios are spread evenly about log 1.1: the bootstrap's 95% interval
    of the median lands on the distribution-free one, the order statistics x(k) and x(n+1-k)
    where k is the binomial(40, 1/2) 2.5% quantile (Hollander and Wolfe, ch. 3), within
    one spacing of the sample (the bootstrap's median takes the sample's values or midpoints)."""
    logs = math.log(1.1) + np.linspace(-0.05, 0.05, 40)
    found = paired_ratio(np.exp(logs).tolist(), [1.0] * 40)
    k = int(stats.binom.ppf(0.025, 40, 0.5))  # rounds below the interval, at most, either side
    spacing = logs[1] - logs[0]
    assert math.log(found.low) == pytest.approx(logs[k], abs=1.01 * spacing)
    assert math.log(found.high) == pytest.approx(logs[len(logs) - 1 - k], abs=1.01 * spacing)
    assert math.log(found.value) == pytest.approx(math.log(1.1), abs=1e-12)


def test_the_inverse_ratio_has_the_inverse_interval():
    rng = np.random.default_rng(3)
    rows, torch_times = rng.uniform(1.0, 1.4, 15).tolist(), rng.uniform(1.0, 1.2, 15).tolist()
    forward, backward = paired_ratio(rows, torch_times), paired_ratio(torch_times, rows)
    assert backward.value == pytest.approx(1 / forward.value)
    assert backward.low == pytest.approx(1 / forward.high, rel=1e-6)
    assert backward.high == pytest.approx(1 / forward.low, rel=1e-6)


def test_one_round_has_no_interval_and_identical_rounds_a_point():
    one = paired_ratio([2.0], [1.0])
    assert one.value == 2.0 and one.low is None and not one.holds(2.0)
    same = paired_ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert (same.value, same.low, same.high) == (2.0, 2.0, 2.0)


def test_rounds_pair_up_to_the_shorter_list_and_nothing_pairs_no_ratio():
    assert paired_ratio([2.0, 4.0, 100.0], [1.0, 1.0]).value == pytest.approx(math.sqrt(8))
    assert paired_ratio([], [1.0]) is None
    assert paired_ratio([1.0, 0.0], [1.0, 1.0]) is None  # a time that is not positive


def test_the_first_rounds_pair_when_the_numerator_has_fewer():
    """Round i against round i: a row with two rounds beside torch's three pairs torch's first
    two (ratios 2 and 2), not its last two (1 and 0.5)."""
    found = paired_ratio([2.0, 4.0], [1.0, 2.0, 8.0])
    assert found.rounds == 2 and found.value == pytest.approx(2.0)


def bootstrap_median_variance(sample: np.ndarray) -> float:
    """The exact variance of the median of a resample of ``sample`` (same size, with
    replacement), summed over every multiset of indices with its multinomial probability."""
    n = len(sample)
    medians, weights = [], []
    for chosen in itertools.combinations_with_replacement(range(n), n):
        counts = np.bincount(chosen, minlength=n)
        weights.append(math.factorial(n) / math.prod(map(math.factorial, counts)) / n**n)
        medians.append(statistics.median(sample[list(chosen)]))
    medians, weights = np.array(medians), np.array(weights)
    mean = (weights * medians).sum()
    return float((weights * (medians - mean) ** 2).sum())


def test_the_two_level_interval_resamples_rounds_inside_each_process():
    """Six processes whose medians nearly agree (offsets -1%..+1%) and whose rounds spread +-10%
    inside each: resampling processes, then rounds, the statistic (the mean of the processes'
    medians) spreads by sqrt((var of the offsets + var of one process's resampled median) /
    processes), 1.96 of which the interval reaches on either side (within 20%); resampling
    processes only would see a third of it."""
    processes, rounds = 6, 8
    inside, offsets = np.linspace(-0.1, 0.1, rounds), np.linspace(-0.01, 0.01, processes)
    logs = (offsets[:, None] + inside[None, :]).ravel()
    labels = np.repeat(np.arange(processes), rounds).tolist()
    found = paired_ratio(np.exp(logs).tolist(), [1.0] * len(logs), processes=labels)
    half = 1.959964 * math.sqrt((offsets.var() + bootstrap_median_variance(inside)) / processes)
    processes_only = 1.959964 * math.sqrt(offsets.var() / processes)
    assert processes_only < half / 3  # the sample tells the two apart
    assert math.log(found.value) == pytest.approx(offsets.mean(), abs=1e-12)
    assert -math.log(found.low) == pytest.approx(half, rel=0.2)
    assert math.log(found.high) == pytest.approx(half, rel=0.2)


def test_a_time_that_is_not_finite_gives_no_ratio_like_nan_zero_and_negative_ones():
    for bad in (math.inf, -math.inf, math.nan, 0.0, -1.0):
        assert paired_ratio([bad, 1.0, 1.1], [1.0, 1.0, 1.0]) is None, bad
        assert paired_ratio([1.0, 1.0, 1.1], [1.0, bad, 1.0]) is None, bad
    assert paired_ratio([1.0, 2.0, math.inf], [1.0, 1.0]).value == pytest.approx(math.sqrt(2))  # unpaired


@pytest.mark.parametrize(("numerators", "denominators", "named"), [
    ("abc", [1.0, 1.0, 1.0], "numerators"),
    ([1.0, 1.0], b"ab", "denominators"),
    ([1.0, "2"], [1.0, 1.0], "numerators"),
    ([1.0, 2.0], [True, 1.0], "denominators"),
    (None, [1.0], "numerators"),
    ([1.0, 2.0], 3.0, "denominators"),
])
def test_times_that_are_not_numbers_are_a_type_error_naming_them(numerators, denominators, named):
    with pytest.raises(TypeError, match=named):
        paired_ratio(numerators, denominators)


@pytest.mark.parametrize("labels", [[0, 0], [0, 0, 1, 1]])
def test_process_labels_must_label_every_round(labels):
    with pytest.raises(ValueError, match=rf"processes.*{len(labels)}.*3 rounds"):
        paired_ratio([1.0, 1.1, 1.2], [1.0, 1.0, 1.0], processes=labels)
    with pytest.raises(ValueError, match=rf"denominator_processes.*{len(labels)}.*3 rounds"):
        paired_ratio([1.0, 1.1, 1.2], [1.0, 1.0, 1.0], processes=[0, 0, 1], denominator_processes=labels)


def test_rounds_pair_within_each_process():
    """A row with fewer rounds in one process than torch: each process's rounds pair with that
    process's torch rounds, the first of each, never another process's."""
    top, top_processes = [1.10, 1.20, 2.2, 2.4, 2.6], [0, 0, 1, 1, 1]
    bottom, bottom_processes = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0], [0, 0, 0, 1, 1, 1]
    found = paired_ratio(top, bottom, processes=top_processes, denominator_processes=bottom_processes)
    first, second = [1.10 / 1.0, 1.20 / 1.0], [2.2 / 2.0, 2.4 / 2.0, 2.6 / 2.0]
    assert found.rounds == 5
    assert found.value == pytest.approx(math.sqrt(log_median(first) * log_median(second)))


def test_pooled_rounds_pair_within_each_process():
    """Through the report: explicit timed two rounds in the first process and three in the
    second, torch three in each; explicit's ×torch pairs each process's own rounds."""
    first = report_with({"explicit": {"forward": [1.10, 1.20], "train": [1.0, 1.0]},
                         "torch": {"forward": [1.0, 1.0, 1.0], "train": [1.0, 1.0, 1.0]}})
    second = report_with({"explicit": {"forward": [2.2, 2.4, 2.6], "train": [1.0, 1.0, 1.0]},
                          "torch": {"forward": [2.0, 2.0, 2.0], "train": [1.0, 1.0, 1.0]}})
    for index, report in enumerate((first, second)):
        report["blocks"][0]["rounds"] = {"orders": [["explicit", "torch"]] * 3, "seed": index,
                                         "others": [0.0] * 3, "contended": [False] * 3}
    row = pool([first, second])["blocks"][0]["rows"][0]
    first, second = [1.10 / 1.0, 1.20 / 1.0], [2.2 / 2.0, 2.4 / 2.0, 2.6 / 2.0]
    assert row["forward_vs_torch"] == pytest.approx(math.sqrt(log_median(first) * log_median(second)))


def test_pooling_no_reports_is_a_value_error():
    with pytest.raises(ValueError, match="at least one report"):
        pool([])


def test_rounds_of_several_processes_resample_processes_too():
    """Four processes, each steady within, three at 1.00 and one at 1.50: one level sees 40
    rounds whose median is 1.00 with a tight interval; two levels see four processes, the
    geometric mean of their medians 1.5^(1/4), and an interval from all four drawn at 1.00
    (probability (3/4)^4, above 2.5%) to three of four drawn at 1.50, 1.5^(3/4) (the binomial
    chance of three or more is 5.1%, of four 0.4%)."""
    ratios = [1.0] * 30 + [1.5] * 10
    ratios = [r * (1 + 0.001 * (i % 3 - 1)) for i, r in enumerate(ratios)]
    flat = paired_ratio(ratios, [1.0] * 40)
    nested = paired_ratio(ratios, [1.0] * 40, processes=np.repeat(np.arange(4), 10).tolist())
    assert flat.value == pytest.approx(1.0, rel=0.002) and flat.high < 1.01
    assert nested.value == pytest.approx(1.5 ** (1 / 4), rel=0.002)
    assert nested.low == pytest.approx(1.0, rel=0.01)
    assert nested.high == pytest.approx(1.5 ** (3 / 4), rel=0.01)


# --- the rounds' order ----------------------------------------------------------------------------


def test_each_round_has_a_fresh_order_drawn_again_from_its_seed():
    names = ["explicit", "einsum", "mathfirst", "fused", "torch", CONTROL]
    orders = round_orders(names, 15, seed=0)
    assert all(sorted(order) == sorted(names) for order in orders)
    assert len({tuple(order) for order in orders}) > 10  # 720 orders: repeats are rare
    assert round_orders(names, 15, seed=0) == orders
    assert round_orders(names, 15, seed=1) != orders


@pytest.mark.parametrize(("rounds", "seed", "named"), [
    (-1, 0, "rounds"), (2.0, 0, "rounds"), (True, 0, "rounds"), (3, -1, "seed"), (3, 2**64, "seed"),
])
def test_round_orders_refuses_a_bad_count_or_seed(rounds, seed, named):
    with pytest.raises((TypeError, ValueError), match=named):
        round_orders(["explicit", "torch"], rounds, seed)


class FakePeak:
    """The matmul peak's interface, measuring nothing."""

    def __init__(self, *args) -> None:
        pass

    def measure(self) -> None:
        pass

    def peak(self) -> None:
        return None


def test_each_rounds_order_is_drawn_when_the_round_starts(monkeypatch):
    """``--rounds 1000000000`` must start timing at once: the first round's cells run before the
    second round's order is drawn (here: the order of draws and cells, nothing timed), and the
    recorded orders are round_orders' own."""
    events = []
    real_rng = np.random.default_rng

    class Spy:  # numpy's generator, logging each shuffle
        def __init__(self, seed):
            self.rng = real_rng(seed)

        def permutation(self, n):
            events.append("order")
            return self.rng.permutation(n)

    monkeypatch.setattr(np.random, "default_rng", Spy)
    monkeypatch.setattr(benchmarks.compare.run, "MatmulPeak", FakePeak)
    monkeypatch.setattr(benchmarks.compare.run, "time_cell", lambda row, mode, *_: events.append(row.variant))
    settings = tiny_settings(variants=("explicit", "torch"), rounds=3)
    rows = [benchmarks.compare.run.Row(name, None) for name in ("explicit", "torch")]
    block = Block("cpu", "float32", settings.shapes[0], batch=None, autocast=None)
    _, record = time_rounds(rows, settings, block, bar=benchmarks.compare.run.tqdm(disable=True))
    per_round = 1 + 2 * len(settings.modes)  # its order, then each mode's two cells
    assert len(events) == 3 * per_round
    assert [index for index, event in enumerate(events) if event == "order"] == [0, per_round, 2 * per_round]
    monkeypatch.setattr(np.random, "default_rng", real_rng)
    assert record["orders"] == round_orders(["explicit", "torch"], 3, seed=0)


def test_the_control_is_a_separate_build_holding_torchs_weights():
    """The control measures torch against itself only if it is a second model: its own
    parameters (no tensor shared with torch's), equal to torch's."""
    settings = tiny_settings(variants=("explicit", "torch"))
    block = Block("cpu", "float32", settings.shapes[0], batch=None, autocast=None)
    rows = {row.variant: row for row in build_rows(settings, block)}
    reference, control = rows[REFERENCE].model, rows[CONTROL].model
    assert control is not reference
    shared = {p.data_ptr() for p in reference.parameters()} & {p.data_ptr() for p in control.parameters()}
    assert not shared
    mine, theirs = export_weights(control), export_weights(reference)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[name], theirs[name]) for name in mine)


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_a_run_records_its_orders_and_times_a_control_unless_told_not_to():
    settings = tiny_settings(variants=("explicit", "torch"), rounds=3)
    (block,) = run(settings)["blocks"]
    assert block["rounds"]["orders"] == round_orders(["explicit", "torch", CONTROL], 3, seed=0)
    assert len(block["rounds"]["others"]) == len(block["rounds"]["contended"]) == 3
    assert [row["variant"] for row in block["rows"]] == ["explicit", "torch"]  # the control apart
    control = block["control"]
    assert control["variant"] == CONTROL and len(control["forward_rounds_s"]) == 3
    assert control["max_abs_dlogp"] == 0.0  # the same weights as torch's
    assert control["forward_vs_torch"] > 0 and control["forward_vs_torch_low"] is not None
    (block,) = run(tiny_settings(variants=("explicit", "torch"), rounds=2, control=False))["blocks"]
    assert block["control"] is None and len(block["rounds"]["orders"][0]) == 2


# --- what the table, json and csv say -----------------------------------------------------------


def cells_by_title(text: str) -> dict[str, dict[str, str]]:
    """variant -> column title -> its cell, from the first github table of ``text``."""
    cells = table_cells(text)
    titles = next(line for line in text.splitlines() if line.startswith("| variant"))
    titles = [title.strip() for title in titles.strip("|").split("|")]
    return {name: dict(zip(titles, row, strict=True)) for name, row in cells.items() if name != "variant"}

SLOWER = [1.30, 1.32, 1.28, 1.31, 1.29, 1.30]  # explicit 30% slower than torch in every round
TORCH = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
NOISY = [1.3, 0.7, 1.2, 0.8, 1.25, 0.75]  # as fast as torch on the whole, but noisy


def test_a_ratio_whose_interval_holds_one_is_shown_as_not_told_apart():
    report = report_with({"explicit": {"forward": SLOWER, "train": NOISY},
                          "torch": {"forward": TORCH, "train": TORCH}})
    explicit = cells_by_title(render(report, "github"))["explicit"]
    expected = math.exp(statistics.mean(math.log(a / b) for a, b in zip(SLOWER, TORCH, strict=True)))
    assert explicit["fwd ×torch"] == f"{expected:.2f}"  # told apart, no mark
    assert explicit["train ×torch"].startswith(SAME_MARK)  # its interval holds 1
    assert cells_by_title(render(report, "github"))["torch"]["fwd ×torch"] == "1.00"  # 1 by definition
    assert f"{SAME_MARK}: not told apart from the column's baseline" in render(report, "github")


def test_a_ratio_inside_the_controls_interval_is_not_told_apart():
    """explicit is 3% slower in every round, which alone is resolved; the control (torch against
    itself) spreads wider than that, so the run cannot resolve 3%."""
    explicit = [1.03 * t for t in TORCH]
    control = [1.06, 0.95, 1.05, 0.96, 1.07, 0.94]
    alone = report_with({"explicit": {"forward": explicit, "train": explicit},
                         "torch": {"forward": TORCH, "train": TORCH}})
    with_control = report_with({"explicit": {"forward": explicit, "train": explicit},
                                "torch": {"forward": TORCH, "train": TORCH},
                                CONTROL: {"forward": control, "train": control}})
    assert not cells_by_title(render(alone, "github"))["explicit"]["fwd ×torch"].startswith(SAME_MARK)
    assert cells_by_title(render(with_control, "github"))["explicit"]["fwd ×torch"].startswith(SAME_MARK)
    lines = render(with_control, "github").splitlines()
    assert any(line.startswith("  control, torch ÷ its copy [95%]: fwd ") for line in lines)
    (block,) = with_control["blocks"]
    assert block["control"]["forward_vs_torch_low"] <= 1.03 <= block["control"]["forward_vs_torch_high"]


def test_wide_json_and_csv_carry_every_intervals_bounds():
    report = report_with({"explicit": {"forward": SLOWER, "train": NOISY},
                          "torch": {"forward": TORCH, "train": TORCH}})
    row = json.loads(render(report, "json"))["blocks"][0]["rows"][0]
    for key in ("forward_vs_torch", "train_vs_torch"):
        assert row[f"{key}_low"] < row[key] < row[f"{key}_high"]
    assert row["forward_vs_torch_resolved"] is True and row["train_vs_torch_resolved"] is False
    header = render(report, "csv").splitlines()[0].split(",")
    assert {"forward_vs_torch_low", "forward_vs_torch_high", "train_vs_torch_resolved"} <= set(header)
    wide = render(report, "github", wide=True)
    low, high = row["forward_vs_torch_low"], row["forward_vs_torch_high"]
    assert f"{row['forward_vs_torch']:.2f} [{low:.2f}, {high:.2f}]" in wide


def test_rounds_on_busy_cores_are_said_first_and_counted_under_the_table():
    record = {"orders": [["explicit", "torch"]] * 6, "seed": 0,
              "others": [0.0, 0.9, 0.0, 1.1, 0.0, 0.0], "contended": [False, True, False, True, False, False]}
    steady = {"explicit": {"forward": SLOWER, "train": SLOWER}, "torch": {"forward": TORCH, "train": TORCH}}
    lines = render(report_with(steady, rounds_record=record), "github").splitlines()
    assert lines[0] == ("warning: 2 of 6 rounds ran on busy cores (others used up to 1.10 cores); "
                        "read each ratio with its interval")
    assert ("  6 rounds, rows in a fresh order each (seed 0); 2 of them on busy cores (in the intervals)"
            in lines)
    quiet = record | {"contended": [False] * 6}
    assert not render(report_with(steady, rounds_record=quiet), "github").startswith("warning")


def test_the_compact_table_fits_120_characters_with_every_ratio_marked_and_every_line():
    noisy = {"forward": NOISY, "train": NOISY}
    record = {"orders": [["a"]] * 6, "seed": 0, "others": [1.0] * 6, "contended": [True] * 6}
    report = report_with({"explicit": noisy, "torch": {"forward": TORCH, "train": TORCH},
                          CONTROL: noisy}, BUSY_CORES, contended=True, scale=9.0, rounds_record=record)
    text = render(report, "github")
    assert text.count(SAME_MARK) >= 3  # both of explicit's ratios and the legend
    assert max(map(len, text.splitlines())) <= 120, text


# --- rounds pooled from several processes ---------------------------------------------------------


def test_pooled_processes_concatenate_rounds_and_resample_by_process():
    """Two processes' reports of the same rows: every round kept with its process, the times the
    median of the processes', the ratios made again over all rounds."""
    first = report_with({"explicit": {"forward": SLOWER, "train": SLOWER},
                         "torch": {"forward": TORCH, "train": TORCH}})
    faster = [0.9 * t for t in SLOWER]
    second = report_with({"explicit": {"forward": faster, "train": faster},
                          "torch": {"forward": TORCH, "train": TORCH}})
    for index, report in enumerate((first, second)):
        report["blocks"][0]["rounds"] = {"orders": [["explicit", "torch"]] * 6, "seed": index,
                                         "others": [0.0] * 6, "contended": [False] * 6}
    pooled = pool([first, second])
    row = pooled["blocks"][0]["rows"][0]
    assert pooled["meta"]["processes"] == 2
    assert row["forward_rounds_s"] == SLOWER + faster
    assert row["forward_rounds_process"] == [0] * 6 + [1] * 6
    medians = [log_median([a / b for a, b in zip(times, TORCH, strict=True)]) for times in (SLOWER, faster)]
    assert row["forward_vs_torch"] == pytest.approx(math.sqrt(medians[0] * medians[1]))
    assert row["forward_ms"] == pytest.approx(statistics.median(
        [report["blocks"][0]["rows"][0]["forward_ms"] for report in (first, second)]))
    assert pooled["blocks"][0]["rounds"]["process"] == [0] * 6 + [1] * 6
    lines = render(pooled, "github").splitlines()
    assert ("  12 rounds from 2 processes, rows in a fresh order each (seeds 0, 1); 0 of them on busy "
            "cores") in lines
    assert ("  ×torch: the row's time / torch's in the same round, its median in each process, their "
            "geometric mean") in lines


def test_peak_memory_measured_by_the_first_process_alone_is_kept():
    """The processes after the first leave peak memory unmeasured (None): the pooled row keeps
    the first's, while times measured by every process are their median."""
    reports = []
    for index, scale in enumerate((1.0, 1.2, 1.1)):
        report = report_with({"explicit": {"forward": SLOWER, "train": SLOWER},
                              "torch": {"forward": TORCH, "train": TORCH}}, scale=scale)
        report["blocks"][0]["rounds"] = {"orders": [["explicit", "torch"]] * 6, "seed": index,
                                         "others": [0.0] * 6, "contended": [False] * 6}
        report["blocks"][0]["rows"][0]["train_peak_mb"] = 123.0 if index == 0 else None
        reports.append(report)
    row = pool(reports)["blocks"][0]["rows"][0]
    assert row["train_peak_mb"] == 123.0
    assert row["forward_ms"] == pytest.approx(1.1 * reports[0]["blocks"][0]["rows"][0]["forward_ms"])


def test_pooling_pooled_reports_keeps_their_processes_apart():
    """Two runs of two processes each, pooled again (how the coverage study takes its reference):
    four processes, each its own label, so the ratio is the geometric mean of four medians and
    not of two runs' medians over their mixed rounds."""
    faster = [0.9 * t for t in SLOWER]
    runs = []
    for run_index, pair in enumerate(((SLOWER, faster), (faster, faster))):
        reports = []
        for index, times in enumerate(pair):
            report = report_with({"explicit": {"forward": times, "train": times},
                                  "torch": {"forward": TORCH, "train": TORCH}})
            report["blocks"][0]["rounds"] = {"orders": [["explicit", "torch"]] * 6,
                                             "seed": 2 * run_index + index, "others": [0.0] * 6,
                                             "contended": [False] * 6}
            reports.append(report)
        runs.append(pool(reports))
    pooled = pool(runs)
    block = pooled["blocks"][0]
    assert pooled["meta"]["processes"] == 4
    assert block["rows"][0]["forward_rounds_process"] == [0] * 6 + [1] * 6 + [2] * 6 + [3] * 6
    assert block["rounds"]["process"] == [0] * 6 + [1] * 6 + [2] * 6 + [3] * 6
    assert block["rounds"]["seed"] == [0, 1, 2, 3]
    medians = [log_median([a / b for a, b in zip(times, TORCH, strict=True)])
               for times in (SLOWER, faster, faster, faster)]
    assert block["rows"][0]["forward_vs_torch"] == pytest.approx(math.prod(medians) ** (1 / 4))


@pytest.mark.slow  # two fresh interpreters, each a short tiny run (about 20 s)
def test_processes_pool_fresh_interpreters_end_to_end(tmp_path):
    output = tmp_path / "pooled.json"
    done = run_compare(*FAST, "--rounds", "2", "--variants", "explicit", "torch", "--processes", "2",
                       "--format", "json", "--output", str(output))
    assert done.returncode == 0, done.stderr
    report = json.loads(output.read_text())
    (block,) = report["blocks"]
    assert report["meta"]["processes"] == 2 and block["rounds"]["seed"] == [0, 1]
    assert block["rounds"]["process"] == [0, 0, 1, 1]
    explicit = next(row for row in block["rows"] if row["variant"] == "explicit")
    assert explicit["forward_rounds_process"] == [0, 0, 1, 1] and len(explicit["forward_rounds_s"]) == 4
    low, value, high = (explicit[f"forward_vs_torch{end}"] for end in ("_low", "", "_high"))
    assert low <= value <= high


def test_csv_takes_every_column_any_row_has():
    """A variant's row and an engine's decode-only row hold different keys: each line has its
    own values under their titles, a cell the row lacks empty, the run's flag last."""
    block = {"device": "cpu", "dtype": "float32", "batch": 2, "src_len": 4, "tgt_len": 4,
             "rows": [{"variant": "fused", "forward_ms": 1.5},
                      {"variant": "onednn", "decode_ms": 2.0, "decode_vs_fused": 0.8}]}
    text = render({"meta": {"contended": False}, "blocks": [block]}, "csv")
    lines = list(csv.DictReader(io.StringIO(text)))
    assert list(lines[0]) == ["device", "dtype", "batch", "src_len", "tgt_len", "variant", "forward_ms",
                              "decode_ms", "decode_vs_fused", "run_contended"]
    assert (lines[0]["forward_ms"], lines[0]["decode_vs_fused"]) == ("1.5", "")
    assert (lines[1]["variant"], lines[1]["forward_ms"], lines[1]["decode_vs_fused"]) == ("onednn", "", "0.8")
    assert [line["run_contended"] for line in lines] == ["False", "False"]
