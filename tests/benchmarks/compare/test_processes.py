"""compare.py's default CPU run spreads its rounds over fresh interpreters: the plan chosen from
the options, and what each interpreter is handed. The mechanism only; how often the intervals
then hold the truth is measured (docs/results/cpu-small-coverage.md), not asserted."""

from __future__ import annotations

import json
import pickle
import subprocess

import pytest

import compare
from benchmarks.compare import processes
from benchmarks.compare.settings import PROCESSES, ROUNDS, ROUNDS_PER_PROCESS, Settings
from benchmarks.compare.workload import TIMING_PRESETS, Shape
from common.config import TransformerConfig
from compare import parse_args


def plan(*options: str) -> tuple[int, int]:
    settings = parse_args(["--preset", "tiny", *options])[0]
    return settings.processes, settings.rounds


def test_a_default_cpu_run_spreads_its_rounds_over_fresh_processes():
    assert PROCESSES > 1
    assert plan() == (PROCESSES, ROUNDS_PER_PROCESS)
    assert plan("--device", "cpu") == (PROCESSES, ROUNDS_PER_PROCESS)


@pytest.mark.parametrize(("options", "expected"), [
    (["--rounds", "7"], (1, 7)),  # rounds asked for: one process of them
    (["--resolution", "0.05"], (1, ROUNDS)),  # adds rounds in one process
    (["--compile"], (1, ROUNDS)),  # each process would compile again
    (["--processes", "1"], (1, ROUNDS)),
    (["--processes", "2"], (2, ROUNDS_PER_PROCESS)),
    (["--processes", "5", "--rounds", "2"], (5, 2)),
])
def test_what_is_asked_for_is_kept_and_the_rest_follows(options, expected):
    assert plan(*options) == expected


def test_resolution_in_several_processes_is_refused_by_the_options_and_the_settings():
    with pytest.raises(SystemExit):
        parse_args(["--preset", "tiny", "--processes", "2", "--resolution", "0.05"])
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    with pytest.raises(ValueError, match=r"resolution.*one process"):
        Settings(config=config, shapes=(Shape(2, 4, 4),), processes=2, resolution=0.05)
    with pytest.raises(ValueError, match=r"Settings\.processes"):
        Settings(config=config, shapes=(Shape(2, 4, 4),), processes=0)


def test_the_default_run_hands_each_fresh_process_its_own_seed(monkeypatch, capsys):
    """compare.py with no options: each interpreter gets the settings as one process of four
    rounds, its rounds' orders (and weights' re-placing) seeded by its index, and their reports
    are pooled: removing the spreading fails here."""
    handed = []

    def fake_interpreter(command, *, input, **kwargs):
        settings = pickle.loads(input)
        handed.append(settings)
        report = {"meta": {"order_seed": settings.order_seed, "contended": False}, "blocks": []}
        return subprocess.CompletedProcess(command, 0, stdout=json.dumps(report).encode(), stderr=b"")

    monkeypatch.setattr(processes.subprocess, "run", fake_interpreter)
    monkeypatch.setattr(compare, "render", lambda report, *args, **kwargs: json.dumps(report["meta"]))
    assert compare.main(["--preset", "tiny", "--quiet"]) == 0
    assert [settings.order_seed for settings in handed] == list(range(PROCESSES))
    assert all(settings.processes == 1 and settings.rounds == ROUNDS_PER_PROCESS for settings in handed)
    assert [settings.measure_memory for settings in handed] == [True] + [False] * (PROCESSES - 1)
    assert json.loads(capsys.readouterr().out)["processes"] == PROCESSES
