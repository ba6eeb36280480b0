"""compare.py's default CPU run spreads its rounds over fresh interpreters: the plan chosen from
the options, and what each interpreter is handed. The mechanism only; how often the intervals
then hold the truth is measured (docs/results/cpu-small-coverage.md), not asserted."""

from __future__ import annotations

import io
import json
import pickle
import sys
from typing import ClassVar

import pytest
from tqdm import tqdm

import compare
from benchmarks.compare import processes
from benchmarks.compare import run as run_module
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


# A fresh process without torch, standing in for `python -m benchmarks.compare.processes`: it keeps
# the settings it is handed (as handed/<index>.pickle, its index the count of those before it), then
# does what its entry of the plan says: `phases` phase lines on stderr, each after a line that is
# not one (unless `noisy` is false), then an error (exit 1), death by SIGKILL, or a report padded
# with `pad` bytes on stdout.
# Its alarm ends it, should it ever be stuck writing, so that a stalled parent fails, not hangs.
FAKE_INTERPRETER = """
import json, os, signal, sys
signal.alarm(60)
plan, handed, phase_done = sys.argv[1:4]
index = len(os.listdir(handed))
with open(os.path.join(handed, f"{index}.pickle"), "wb") as file:
    file.write(sys.stdin.buffer.read())
with open(plan) as file:
    step = json.load(file)[index]
for _ in range(step["phases"]):
    if step.get("noisy", True):
        sys.stderr.write("UserWarning: a line of the process's own\\n")
    sys.stderr.write(phase_done + "\\n")
    sys.stderr.flush()
if step.get("error"):
    sys.stderr.write("Traceback (most recent call last):\\n  ...\\n" + step["error"] + "\\n")
    sys.exit(1)
if step.get("killed"):
    os.kill(os.getpid(), signal.SIGKILL)
report = {"meta": {"order_seed": index, "contended": False, "pad": "x" * step.get("pad", 0)}, "blocks": []}
sys.stdout.write(json.dumps(report))
"""


@pytest.fixture
def interpreter(monkeypatch, tmp_path):
    """Replace the fresh interpreters by FAKE_INTERPRETER; call it with each process's plan; it
    returns the directory where they keep the settings they were handed."""
    def follow(plan: list[dict]):
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        handed = tmp_path / "handed"
        handed.mkdir()
        monkeypatch.setattr(processes, "WORKER", ("-c", FAKE_INTERPRETER, str(tmp_path / "plan.json"),
                                                  str(handed), processes.PHASE_DONE))
        return handed
    return follow


def handed_settings(handed) -> list[Settings]:
    return [pickle.loads((handed / f"{index}.pickle").read_bytes())
            for index in range(len(list(handed.iterdir())))]


def test_the_default_run_hands_each_fresh_process_its_own_seed(interpreter, monkeypatch, capsys):
    """compare.py with no options: each interpreter gets the settings as one process of four
    rounds, its rounds' orders (and weights' re-placing) seeded by its index, and their reports
    are pooled: removing the spreading fails here."""
    handed = interpreter([{"phases": 0}] * PROCESSES)
    monkeypatch.setattr(compare, "render", lambda report, *args, **kwargs: json.dumps(report["meta"]))
    assert compare.main(["--preset", "tiny", "--quiet"]) == 0
    settings = handed_settings(handed)
    assert [one.order_seed for one in settings] == list(range(PROCESSES))
    assert all(one.processes == 1 and one.rounds == ROUNDS_PER_PROCESS for one in settings)
    assert [one.measure_memory for one in settings] == [True] + [False] * (PROCESSES - 1)
    assert not any(one.show_progress for one in settings)  # the parent's bar is the only one
    assert json.loads(capsys.readouterr().out)["processes"] == PROCESSES


def three_processes(**changes) -> Settings:
    """Three processes of four rounds of explicit and torch (and torch's control), forward and
    train: 1 log-prob check + 3 warm-ups + 4 rounds x 2 modes, + 1 for the first's peak memory."""
    fields = dict(config=TransformerConfig(**TIMING_PRESETS["tiny"].fields), shapes=(Shape(2, 8, 6),),
                  variants=("explicit", "torch"), rounds=4, decode_len=1, processes=3)
    return Settings(**{**fields, **changes})


PHASES_OF_THREE = [13, 12, 12]  # three_processes' phases, by hand, process by process


class CountedBar(tqdm):
    """A bar written to nowhere, kept to be read: its count, its total, whether it was closed."""

    made: ClassVar[list[CountedBar]] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "file": io.StringIO()})
        self.closed = False
        CountedBar.made.append(self)

    def close(self) -> None:
        self.closed = True
        super().close()


@pytest.fixture
def counted():
    CountedBar.made = []
    return CountedBar


def test_one_bar_counts_every_phase_the_processes_report_and_no_other_line(interpreter, counted):
    interpreter([{"phases": phases} for phases in PHASES_OF_THREE])
    report = processes.run_processes(three_processes(), progress=counted)
    (bar,) = counted.made
    assert bar.total == sum(PHASES_OF_THREE) and bar.n == sum(PHASES_OF_THREE)
    assert bar.closed and not bar.leave  # gone once the processes end
    assert report["meta"]["processes"] == 3


def test_a_process_that_dies_midway_gives_its_last_line_of_error(interpreter, counted):
    interpreter([{"phases": 13}, {"phases": 5, "error": "ValueError: the fifth phase failed"}])
    with pytest.raises(RuntimeError) as raised:
        processes.run_processes(three_processes(), progress=counted)
    assert str(raised.value) == "process 2 of 3 failed: ValueError: the fifth phase failed"
    (bar,) = counted.made
    assert bar.n == 13 + 5 and bar.closed  # cleared before compare.py prints the error


@pytest.mark.parametrize(("noisy", "message"), [
    (False, "killed by SIGKILL"),
    (True, "killed by SIGKILL; last line on stderr: UserWarning: a line of the process's own"),
])
def test_a_killed_process_says_so_and_never_with_a_phase_line(interpreter, counted, noisy, message):
    """Its last line on stderr was a phase's: the message gives the signal, and its last own line."""
    interpreter([{"phases": 3, "killed": True, "noisy": noisy}])
    with pytest.raises(RuntimeError) as raised:
        processes.run_processes(three_processes(), progress=counted)
    assert str(raised.value) == f"process 1 of 3 failed: {message}"


def test_a_failing_process_is_one_line_from_compare(interpreter, capsys):
    interpreter([{"phases": 1, "error": "MemoryError: out of memory"}])
    with pytest.raises(SystemExit) as exited:
        compare.main(["--preset", "tiny", "--quiet"])
    assert exited.value.code == \
        f"compare.py: error: process 1 of {PROCESSES} failed: MemoryError: out of memory"


def test_a_report_larger_than_a_pipe_holds_does_not_stall_the_run(interpreter, counted):
    """The report comes after the last phase line, as run's does: a parent reading stderr to its
    end before stdout would wait on a process waiting on it (the process's alarm ends the wait)."""
    interpreter([{"phases": phases, "pad": 2**20} for phases in PHASES_OF_THREE])
    report = processes.run_processes(three_processes(), progress=counted)
    assert len(report["meta"]["pad"]) == 2**20
    assert counted.made[0].n == sum(PHASES_OF_THREE)


@pytest.mark.parametrize("show", [False, True])
def test_no_progress_writes_nothing_on_stderr(interpreter, capfd, show):
    interpreter([{"phases": phases} for phases in PHASES_OF_THREE])
    processes.run_processes(three_processes(show_progress=show))
    err = capfd.readouterr().err
    assert (err != "") == show  # the bar is there only when asked for, the processes' own lines never


@pytest.mark.parametrize("measure_memory", [True, False])
def test_run_counts_as_many_phases_as_the_parent_expects_of_it(monkeypatch, measure_memory):
    """The parent's total is what run itself counts, with the peak memory measured or not:
    explicit alone, one round of forward and train: 1 log-prob check + 1 warm-up + 2 + memory.
    (Kept quick: the matmul peak timed on one small shape, not its large square; the memory
    phase counted but its profiling skipped.)"""
    monkeypatch.setattr(run_module, "gemm_shapes", small_gemm_shapes)
    monkeypatch.setattr(run_module, "measure_memory", skip_memory)
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    settings = Settings(config=config, shapes=(Shape(2, 8, 6),), variants=("explicit",), rounds=1,
                        min_run_time=0.001, decode_len=1, threads=1, keep_freed_memory=False,
                        replace_weights=False, measure_memory=measure_memory, show_progress=False)
    ended = []
    run_module.run(settings, on_phase=lambda: ended.append(1))
    assert len(ended) == 4 + measure_memory
    assert run_module.total_phases(settings) == 4 + measure_memory


def small_gemm_shapes(*args) -> list[tuple[int, int, int]]:
    return [(4, 4, 4)]


def skip_memory(*args) -> None:
    pass


def test_a_process_reports_each_phase_on_its_stderr(monkeypatch, capsys):
    """The worker's side: run's phases become PHASE_DONE lines on stderr, the report stays alone
    on stdout."""
    def fake_run(settings, on_phase):
        for _ in range(4):
            on_phase()
        return {"meta": {"order_seed": settings.order_seed}, "blocks": []}

    monkeypatch.setattr(processes, "run", fake_run)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(pickle.dumps(three_processes()))))
    assert processes.main() == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [processes.PHASE_DONE] * 4
    assert json.loads(out) == {"meta": {"order_seed": 0}, "blocks": []}
