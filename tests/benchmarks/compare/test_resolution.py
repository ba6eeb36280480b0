"""``--resolution``: rounds added until every ratio the table prints is resolved to it, or until
the time cap, and the line that says how far a run resolved its ratios. The rounds' times are
made up (the round runner is replaced); the expected stopping round is found here from the
made-up times and paired_ratio, the statistic tested in test_ratios.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

import benchmarks.compare.run
from benchmarks.compare.measured import Cell, Row
from benchmarks.compare.ratios import paired_ratio
from benchmarks.compare.render import render
from benchmarks.compare.run import CONTROL, Block, time_rounds
from benchmarks.compare.settings import PROCESSES, ROUNDS_PER_PROCESS
from compare import parse_args
from tests.benchmarks.compare.test_busy_cores import report_with
from tests.benchmarks.compare.test_compare import tiny_settings
from tests.benchmarks.compare.test_ratios import FakePeak
from variants import REFERENCE

NAMES = ("explicit", REFERENCE, CONTROL)
MODES = ("forward", "train")  # tiny_settings' (no decoding)
SPEED = {"explicit": 1.2, REFERENCE: 1.0, CONTROL: 1.0}


def made_up_times(spread: float, rounds: int = 200) -> dict[str, dict[str, list[float]]]:
    """Each row's seconds in each round, per mode: its speed times a round's drift shared by
    every row (which pairing cancels) times noise of its own (which it does not)."""
    rng = np.random.default_rng(7)
    drift = rng.uniform(0.8, 1.2, (len(MODES), rounds))
    return {name: {mode: (SPEED[name] * drift[m] * np.exp(rng.normal(0, spread, rounds))).tolist()
                   for m, mode in enumerate(MODES)} for name in NAMES}


def unwrapped(text: str) -> str:
    """A rendered report with the lines under its tables unwrapped (a long note goes on in
    lines indented by two more spaces)."""
    return re.sub(r"\n    (?=\S)", " ", text)


def half_width(numerators: list[float], denominators: list[float]) -> float:
    """The relative half-width of the paired ratio's interval: its farther bound from the value."""
    found = paired_ratio(numerators, denominators)
    return max(found.high / found.value - 1, 1 - found.low / found.value)


def widest(times: dict, rounds: int) -> float:
    """The widest half-width after ``rounds`` rounds over what the table prints (explicit's
    ratios, the control's; torch's own is 1 by definition)."""
    return max(half_width(times[name][mode][:rounds], times[REFERENCE][mode][:rounds])
               for name in ("explicit", CONTROL) for mode in MODES)


def run_rounds(monkeypatch, times: dict, *, rounds: int, resolution: float | None,
               seconds_per_cell: float = 1.0, deadline: float = 10_000.0) -> dict:
    """time_rounds with the round runner replaced: each cell appends its made-up time, and a
    clock of its own advances ``seconds_per_cell`` per cell. The rounds' record."""
    now = [0.0]

    def cell(row, mode, *_):
        row.cells[mode].rounds.append(times[row.variant][mode][len(row.cells[mode].rounds)])
        now[0] += seconds_per_cell

    monkeypatch.setattr(benchmarks.compare.run, "MatmulPeak", FakePeak)
    monkeypatch.setattr(benchmarks.compare.run, "time_cell", cell)
    monkeypatch.setattr(benchmarks.compare.run, "perf_counter", lambda: now[0])
    settings = tiny_settings(variants=("explicit", REFERENCE), rounds=rounds, resolution=resolution)
    rows = [Row(name, None, cells={mode: Cell() for mode in MODES}) for name in NAMES]
    block = Block("cpu", "float32", settings.shapes[0], batch=None, autocast=None)
    bar = benchmarks.compare.run.tqdm(disable=True)
    _, record = time_rounds(rows, settings, block, bar=bar, deadline=deadline)
    return record


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_rounds_stop_at_the_first_that_meets_the_resolution(monkeypatch):
    times, target = made_up_times(spread=0.05), 0.03
    expected = next(n for n in range(5, 200) if widest(times, n) <= target)
    assert expected > 10  # the test sees rounds added, not the least alone
    record = run_rounds(monkeypatch, times, rounds=5, resolution=target)
    assert len(record["orders"]) == expected
    assert record["resolution"] == {"target": target, "met": True, "max_seconds": 600.0}


def test_no_rounds_are_added_past_the_least_once_it_is_met(monkeypatch):
    """Steady made-up rounds meet ±3% at once: the least number of rounds is all there is."""
    times = made_up_times(spread=0.001)
    assert widest(times, 10) <= 0.03
    assert len(run_rounds(monkeypatch, times, rounds=10, resolution=0.03)["orders"]) == 10


def test_without_resolution_the_rounds_asked_are_all_there_is(monkeypatch):
    record = run_rounds(monkeypatch, made_up_times(spread=0.3), rounds=7, resolution=None)
    assert len(record["orders"]) == 7 and "resolution" not in record


def test_the_time_cap_stops_adding_rounds_and_the_shortfall_is_named(monkeypatch):
    """A resolution the noise never reaches: rounds are added until the clock passes the cap
    (6 cells a round, a second each: the round that starts at 96 s is the last, the 17th), then
    the table says the resolution was not reached and names each ratio short of it."""
    times, target = made_up_times(spread=0.3), 0.01
    record = run_rounds(monkeypatch, times, rounds=5, resolution=target, deadline=100.0)
    assert len(record["orders"]) == 17
    assert record["resolution"]["met"] is False
    count = len(record["orders"])
    report = report_with({name: {mode: times[name][mode][:count] for mode in MODES} for name in NAMES},
                         rounds_record=record)
    (line,) = (line for line in unwrapped(render(report, "github")).splitlines()
               if "ratios resolved to" in line)
    assert "not within the ±1.0% asked" in line and "cap stopped it after 17 rounds" in line
    short = line.split("short: ", 1)[1]
    for name in ("explicit", CONTROL):
        for mode, title in (("forward", "fwd"), ("train", "train")):
            width = half_width(times[name][mode][:count], times[REFERENCE][mode][:count])
            label = f"{name} {title}" + (" ×torch" if name != CONTROL else "")
            assert f"{label} ±{width:.1%}" in short


def test_the_resolution_line_gives_the_widest_interval_and_what_was_asked():
    """The default run's line is the widest half-width over the table's ratios and the
    control's; with --resolution met, it says so and after how many rounds."""
    times = made_up_times(spread=0.05)
    rounds = {name: {mode: times[name][mode][:12] for mode in MODES} for name in NAMES}
    report = report_with(rounds)
    (line,) = (line for line in render(report, "github").splitlines() if "ratios resolved" in line)
    assert f"ratios resolved to ±{widest(times, 12):.1%} (95% intervals" in line
    record = {"orders": [list(NAMES)] * 12, "seed": 0, "others": [0.0] * 12, "contended": [False] * 12,
              "resolution": {"target": 0.5, "met": True, "max_seconds": 600.0}}
    met = render(report_with(rounds, rounds_record=record), "github")
    assert "within the ±50.0% asked, after 12 rounds" in unwrapped(met)


@pytest.mark.parametrize(("options", "named"), [
    (["--resolution", "1.5"], "--resolution"),
    (["--resolution", "0"], "--resolution"),
    (["--max-seconds", "30"], "--max-seconds is an option of --resolution"),
    (["--resolution", "0.03", "--processes", "2"], "--processes"),
    (["--resolution", "0.03", "--max-seconds", "-1"], "--max-seconds"),
    (["--resolution", "nan"], "--resolution must be in (0, 1), got nan"),
    (["--resolution", "inf"], "--resolution must be in (0, 1), got inf"),
    (["--resolution", "-0.1"], "--resolution must be in (0, 1), got -0.1"),
    (["--resolution", "0.03", "--processes", "3"],
     "--resolution adds rounds in one process; with --processes > 1 give --rounds instead"),
])
def test_bad_resolution_options_exit_2_with_one_line(options, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", *options])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("compare.py: error: ") and named in line


def test_resolution_options_reach_the_settings():
    settings = parse_args(["--preset", "tiny", "--resolution", "0.03", "--max-seconds", "90"])[0]
    assert (settings.resolution, settings.max_seconds) == (0.03, 90.0)
    assert parse_args(["--preset", "tiny"])[0].resolution is None


def test_the_old_option_name_is_unknown(capsys):
    """One meaning of "precision" in the project (the number format): the statistical option
    has another name, and the old one is argparse's own unknown option."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", "--precision", "0.03"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --precision 0.03" in capsys.readouterr().err


def test_the_help_says_what_a_resolution_does_to_the_process_plan(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    option = help_text.rsplit("--resolution FRACTION", 1)[1].split("--max-seconds", 1)[0]
    default = f"{PROCESSES} processes x {ROUNDS_PER_PROCESS} rounds on the CPU"
    assert f"1 process, not the default {default}" in option
    assert "adds rounds" in option


@pytest.mark.parametrize("value", ["no", 1, None])
def test_settings_refuse_a_replace_weights_that_is_not_a_bool(value):
    """A truthy string would re-place the weights where "no" was meant."""
    with pytest.raises(TypeError, match=rf"Settings.replace_weights must be True or False, got .*{value!r}"):
        tiny_settings(replace_weights=value)
