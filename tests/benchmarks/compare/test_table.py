"""The default table as a newcomer reads it: a header per ratio naming what it is against,
decoding compared cached with cached, the legend saying how a ratio is made, a warning when the
control tells two copies of torch apart, every line within 120 characters, and a progress bar
that counts every phase. Made-up rounds, nothing timed but the progress bar's short run."""

from __future__ import annotations

import math
import statistics
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import nn

import benchmarks.compare.run
from benchmarks.compare.measured import Row
from benchmarks.compare.render import control_warnings, render, warning_lines
from benchmarks.compare.report import block_result, meta, row_result
from benchmarks.compare.run import CONTROL, run
from benchmarks.compare.settings import Settings
from benchmarks.compare.timing import Peak
from benchmarks.compare.workload import TIMING_PRESETS, Shape
from common.config import TransformerConfig
from tests.benchmarks.compare.test_busy_cores import BUSY_CORES, timed_cell
from tests.benchmarks.compare.test_compare import tiny_settings
from tests.benchmarks.compare.test_ratios import cells_by_title
from variants import REFERENCE, VARIANTS

ROUNDS = 10
IDS = 120  # ids one decoding call produces: 8 sources x 15 steps
# each row's speed per mode against torch's; torch and its control recompute when decoding
SPEEDS = {"explicit": (1.2, 1.1, 1.3), "einsum": (0.92, 1.0, 1.1), "mathfirst": (1.0, 1.02, 1.2),
          "fused": (0.9, 0.95, 1.0), REFERENCE: (1.0, 1.0, 2.0), CONTROL: (1.0, 1.0, 2.0)}


class Model(nn.Module):
    """A stand-in for a variant: its parameter count and whether it decodes with a cache."""

    def __init__(self, cache: bool, params: int = 9_310_000) -> None:
        super().__init__()
        self.cache = cache
        self.weight = nn.Parameter(torch.zeros(params))

    @property
    def has_cache(self) -> bool:
        return self.cache


def made_up_rounds(control_apart: float = 1.0, scale: float = 1.0, spread: float = 0.02,
                   apart_modes: tuple[str, ...] = ("forward",)) -> dict:
    """variant -> mode -> each round's seconds a call: its speed, a drift every row shares in
    each round, and noise of its own; the control ``control_apart`` times torch's in
    ``apart_modes``."""
    rng = np.random.default_rng(3)
    drift = rng.uniform(0.9, 1.1, ROUNDS)
    bases = {"forward": 0.3968, "train": 1.2, "decode": 0.3}
    apart = {(CONTROL, mode): control_apart for mode in apart_modes}
    return {name: {mode: (scale * bases[mode] * speeds[m] * apart.get((name, mode), 1.0)
                          * drift * rng.uniform(1 - spread, 1 + spread, ROUNDS)).tolist()
                   for m, mode in enumerate(bases)} for name, speeds in SPEEDS.items()}


def table_report(rounds: dict, *, busy: bool = False, rounds_record: dict | None = None) -> dict:
    """The small preset's default report from made-up rounds, through the report's own
    row_result, block_result and meta."""
    settings = Settings(config=TransformerConfig(**TIMING_PRESETS["small"].fields),
                        shapes=(Shape(8, 64, 64),), preset="small", variants=VARIANTS, show_progress=False)
    rows = []
    for name, modes in rounds.items():
        row = Row(name, Model(cache=name not in (REFERENCE, CONTROL)),
                  cells={mode: timed_cell(seconds) for mode, seconds in modes.items()},
                  decode_positions={"decode": IDS}, max_abs_dlogp=1.9e-6,
                  peak_mb={"forward": 300.0, "train": 12_345.0})
        row.fast_path = name == REFERENCE
        rows.append(row)
    peak = Peak(150e9, 5e9, (150e9,), (1024, 512, 512), {(1024, 512, 512): 150e9})
    results = [row_result(row, settings, Shape(8, 64, 64), peak.flops_per_second) for row in rows]
    control = next(result for result in results if result["variant"] == CONTROL)
    record = rounds_record or {"orders": [list(rounds)] * ROUNDS, "seed": 0, "others": [0.0] * ROUNDS,
                               "contended": [False] * ROUNDS}
    block = block_result("cpu", "float32", Shape(8, 64, 64), peak, [r for r in results if r is not control],
                         control=control, rounds=record, float32_matmul_precision="IEEE float32")
    allocator = "glibc keeps freed memory (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"
    report = {"meta": meta(settings, allocator), "blocks": [block]}
    if busy:
        report["meta"]["cores"], report["meta"]["contended"] = BUSY_CORES, True
    return report


def median_ratio(top: list[float], bottom: list[float]) -> float:
    """The median of the paired rounds' ratios, on their logarithms (the standard library's)."""
    return math.exp(statistics.median(math.log(a / b) for a, b in zip(top, bottom, strict=True)))


def test_every_ratio_column_says_what_it_is_against():
    text = render(table_report(made_up_rounds()), "github")
    titles = [t.strip() for t in next(line for line in text.splitlines() if line.startswith("| variant"))
              .strip("|").split("|")]
    assert titles == ["variant", "fwd ms", "fwd ×torch", "train ms", "train ×torch", "decode tok/s",
                      "decode ×fused", "peak MB", "max Δ logp"]
    assert len(set(titles)) == len(titles)
    assert "(9.31M params)" in text.splitlines()[1]  # the count every row shares, in the header


def test_decoding_is_compared_cached_with_cached_and_torch_said_to_recompute():
    """explicit's decode ×fused is its cached decoding per id against fused's, paired by round
    (not against torch's full recompute, which would make it look 1.5x faster); torch's cell
    says it has no cache; the legend says both."""
    rounds = made_up_rounds()
    report = table_report(rounds)
    cells = cells_by_title(render(report, "github"))
    expected = median_ratio(rounds["explicit"]["decode"], rounds["fused"]["decode"])
    against_torch = median_ratio(rounds["explicit"]["decode"], rounds[REFERENCE]["decode"])
    assert abs(expected - against_torch) > 0.5  # the two baselines tell apart
    assert cells["explicit"]["decode ×fused"] == f"{expected:.2f}"
    assert cells["fused"]["decode ×fused"] == "1.00"  # its own baseline, unmarked
    assert cells[REFERENCE]["decode ×fused"] == "no cache"
    assert cells[REFERENCE]["decode tok/s"] == f"{IDS / statistics.median(rounds[REFERENCE]['decode']):,.0f}"
    text = render(report, "github")
    lines = text.splitlines()
    assert any(line.startswith("  decode: greedy with the row's key/value cache, ids per second; "
                               "×fused: time per id / fused's") for line in lines)
    assert ("  torch has no cache: it recomputes every step, so its tok/s is full recompute's, "
            "not compared") in lines
    row = next(row for row in report["blocks"][0]["rows"] if row["variant"] == REFERENCE)
    assert "decode_vs_fused" not in row and row["decode_vs_torch"] is not None  # json keeps its own


def test_the_legend_says_a_ratio_is_a_median_of_paired_rounds_not_ms_over_ms():
    """Here explicit's ms over torch's is not its ×torch, and the legend says why: torch's
    rounds slow down halfway through, explicit is 1.5x slower in the first half and as fast in
    the second, so its ×torch, the median of five ratios of 1.5 and five of 1, is sqrt(1.5) =
    1.22 (the middle two's geometric mean) and its median over torch's 1.75 / 1.5 = 1.17."""
    rounds = made_up_rounds()
    rounds[REFERENCE]["forward"] = [1.0] * 5 + [2.0] * 5
    rounds["explicit"]["forward"] = [1.5] * 5 + [2.0] * 5
    report = table_report(rounds)
    cells = cells_by_title(render(report, "github"))
    assert cells["explicit"]["fwd ×torch"].lstrip("≈") == f"{math.sqrt(1.5):.2f}"
    assert (cells["explicit"]["fwd ms"], cells[REFERENCE]["fwd ms"]) == ("1750.0", "1500.0")
    lines = render(report, "github").splitlines()
    assert ("  ×torch: the median over rounds of the row's time / torch's in the same round; "
            "< 1 is faster") in lines
    assert any(line.startswith("  ms: a call's median time over rounds, so ms / torch's ms need not "
                               "equal ×torch") for line in lines)


def test_a_control_that_tells_two_copies_of_torch_apart_is_warned_about():
    """A control 7% slower than torch in every round: its interval leaves 1 out, and the first
    line says what that means for this run's forward ratios; train and decode, whose control
    holds 1, get no warning, and a run whose control holds 1 gets none at all."""
    report = table_report(made_up_rounds(control_apart=1.07, spread=0.005))
    control = report["blocks"][0]["control"]
    low, value, high = (control[f"forward_vs_torch{end}"] for end in ("_low", "", "_high"))
    assert not low <= 1.0 <= high and control["train_vs_torch_low"] <= 1.0 <= control["train_vs_torch_high"]
    warning = (f"warning: control fwd {value:.2f} [{low:.2f}, {high:.2f}] excludes 1: torch and its copy "
               f"differ by 7%; read fwd ratios ±7% wider")
    assert warning_lines(report) == [warning]  # what compare.py also writes to stderr beside json
    assert render(report, "github").splitlines()[0] == warning
    assert not warning_lines(table_report(made_up_rounds()))


def test_every_line_the_default_run_prints_fits_120_characters():
    """The widest the default table gets: five-digit ms, six-digit rates, every ratio marked,
    every warning (busy cores, a control off in every mode), a resolution not met."""
    rounds = made_up_rounds(control_apart=1.3, scale=40.0, spread=0.3,
                            apart_modes=("forward", "train", "decode"))
    record = {"orders": [list(rounds)] * ROUNDS, "seed": 0, "others": [1.0] * ROUNDS,
              "contended": [True] * ROUNDS,
              "resolution": {"target": 0.001, "met": False, "max_seconds": 600.0}}
    for wide in (False, True):
        text = render(table_report(rounds, busy=True, rounds_record=record), "github", wide=wide)
        lines = text.splitlines()
        assert any("short: " in line for line in lines)
        assert sum("warning: control" in line for line in lines) == 3
        # the wide table itself is as wide as its columns; every other line keeps to 120
        checked = lines if not wide else [line for line in lines if not line.startswith("|")]
        assert max(map(len, checked)) <= 120, text


def test_a_control_bound_next_to_one_shows_which_side_of_one_it_is():
    """[0.20, 0.998] leaves 1 out; printed to two places it would read [0.20, 1.00]."""
    control = {"forward_vs_torch": 0.58, "forward_vs_torch_low": 0.2, "forward_vs_torch_high": 0.998}
    block = {"device": "cpu", "dtype": "float32", "batch": 1, "src_len": 1, "tgt_len": 1, "control": control}
    (line,) = control_warnings({"blocks": [block]})
    assert line.startswith("warning: control fwd 0.58 [0.20, 0.998] excludes 1: ")


class CountingBar:
    """tqdm's interface as run() uses it: the total it is given and grows, the phases counted."""

    made: ClassVar[list[CountingBar]] = []

    def __init__(self, total: int | None = None, **_) -> None:
        self.total, self.n = total, 0
        CountingBar.made.append(self)

    def __enter__(self) -> CountingBar:
        return self

    def __exit__(self, *_) -> None:
        pass

    def update(self, count: int = 1) -> None:
        self.n += count

    def set_description_str(self, _: str) -> None:
        pass

    def refresh(self) -> None:
        pass


@pytest.mark.parametrize("changes", [  # the two variations of the phases' count are slow
    dict(), pytest.param(dict(control=False), marks=pytest.mark.slow),
    pytest.param(dict(resolution=0.001, max_seconds=20.0), marks=pytest.mark.slow),
], ids=["control", "no control", "resolution"])
def test_the_progress_bar_counts_every_phase(monkeypatch, changes):
    """A short tiny run (two rows, decoding, the control unless not): the bar ends at its total,
    which counted every phase: the control's warm-up, and the rounds --resolution adds."""
    CountingBar.made.clear()
    monkeypatch.setattr(benchmarks.compare.run, "tqdm", CountingBar)
    if "resolution" in changes:  # made-up noisy rounds, a second a cell on a clock of their own:
        # ±0.1% is never met, and the 20 s cap stops the run after the third round (9 cells each)
        rng, now = np.random.default_rng(0), [0.0]

        def cell(row, mode, *_):
            row.cells[mode].rounds.append(float(rng.uniform(0.5, 1.5)))
            now[0] += 1.0

        monkeypatch.setattr(benchmarks.compare.run, "time_cell", cell)
        monkeypatch.setattr(benchmarks.compare.run, "perf_counter", lambda: now[0])
        monkeypatch.setattr(benchmarks.compare.run, "measure_memory", lambda *_: None)
    settings = tiny_settings(**{"variants": ("explicit", REFERENCE), "decode_len": 3, "rounds": 2, **changes})
    report = run(settings)
    (bar,) = CountingBar.made
    assert bar.n == bar.total
    rounds = len(report["blocks"][0]["rounds"]["orders"])
    timed = 3 if changes.get("control", True) else 2
    assert bar.total == 1 + timed + rounds * 3 + 1  # log-probs, warm-ups, rounds x modes, memory
    assert rounds == (3 if "resolution" in changes else 2)


def test_the_placement_line_says_what_one_process_leaves_out():
    """Re-placing the weights each round does not vary what one interpreter keeps for all its
    rounds (docs/results/cpu-small-coverage.md): a one-process run says so and names the cure,
    a pooled run of several processes does not."""
    from benchmarks.compare.render import placement_line

    one = placement_line({"replace_weights": True})
    assert "--processes 3" in one and "not in the intervals" in one
    assert "--processes" not in placement_line({"replace_weights": True, "processes": 3})
    assert placement_line({}) is None
