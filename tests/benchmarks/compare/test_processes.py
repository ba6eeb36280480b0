"""compare.py's default CPU run spreads its rounds over fresh interpreters: the plan chosen from
the options, and what each interpreter is handed. The mechanism only; how often the intervals
then hold the truth is measured (docs/results/cpu-small-coverage.md), not asserted."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
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
# not one (unless `noisy` is false), the timing-done line after `timed_at` of them (if given), then
# an error (exit 1), death by SIGKILL, or a report padded with `pad` bytes on stdout.
# Its alarm ends it, should it ever be stuck writing, so that a stalled parent fails, not hangs.
FAKE_INTERPRETER = """
import json, os, signal, sys
signal.alarm(60)
plan, handed, phase_done, timed = sys.argv[1:5]
settings = sys.stdin.buffer.read()
index = len(os.listdir(handed))
with open(os.path.join(handed, f"{index}.pickle"), "wb") as file:
    file.write(settings)
with open(plan) as file:
    step = json.load(file)[index]
for done in range(step["phases"]):
    if step.get("noisy", True):
        sys.stderr.write("UserWarning: a line of the process's own\\n")
    sys.stderr.write(phase_done + "\\n")
    if done + 1 == step.get("timed_at"):
        sys.stderr.write(timed + "\\n")
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
                                                  str(handed), processes.PHASE_DONE, processes.TIMED))
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
    assert [one.measure_shared for one in settings] == [True] + [False] * (PROCESSES - 1)
    assert not any(one.show_progress for one in settings)  # the parent's bar is the only one
    assert json.loads(capsys.readouterr().out)["processes"] == PROCESSES


def three_processes(**changes) -> Settings:
    """Three processes of four rounds of explicit and torch (and torch's control), forward and
    train: 3 warm-ups + 4 rounds x 2 modes, + the first's log-prob check and peak memory."""
    fields = dict(config=TransformerConfig(**TIMING_PRESETS["tiny"].fields), shapes=(Shape(2, 8, 6),),
                  variants=("explicit", "torch"), rounds=4, decode_len=1, processes=3)
    return Settings(**{**fields, **changes})


PHASES_OF_THREE = [13, 11, 11]  # three_processes' phases, by hand, process by process


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


@pytest.mark.parametrize("measure_shared", [True, False])
def test_run_counts_as_many_phases_as_the_parent_expects_of_it(monkeypatch, measure_shared):
    """The parent's total is what run itself counts, in the first process or a later one:
    explicit alone, one round of forward and train: 1 warm-up + 2, + the log-prob check and
    the peak memory in the first.
    (Kept quick: the matmul peak timed on one small shape, not its large square; the memory
    phase counted but its profiling skipped.)"""
    monkeypatch.setattr(run_module, "gemm_shapes", small_gemm_shapes)
    monkeypatch.setattr(run_module, "measure_memory", skip_memory)
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    settings = Settings(config=config, shapes=(Shape(2, 8, 6),), variants=("explicit",), rounds=1,
                        min_run_time=0.001, decode_len=1, threads=1, keep_freed_memory=False,
                        replace_weights=False, measure_shared=measure_shared, show_progress=False)
    ended = []
    run_module.run(settings, on_phase=lambda: ended.append(1))
    assert len(ended) == 3 + 2 * measure_shared
    assert run_module.total_phases(settings) == 3 + 2 * measure_shared


def test_a_later_process_leaves_to_the_first_what_the_pooled_report_keeps_of_it(monkeypatch):
    """Process 2 of 3 checks no log-probs and times no matmul peak (nor profiles memory): the
    pooled report takes them from process 1, whose own report has them."""
    monkeypatch.setattr(run_module, "gemm_shapes", small_gemm_shapes)
    monkeypatch.setattr(run_module, "measure_memory", skip_memory)
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    settings = Settings(config=config, shapes=(Shape(2, 8, 6),), variants=("explicit", "torch"), rounds=1,
                        min_run_time=0.001, decode_len=1, threads=1, keep_freed_memory=False,
                        replace_weights=False, processes=3, show_progress=False)
    first, later = (run_module.run(processes.settings_of(settings, index)) for index in (0, 1))
    for report, measured in ((first, True), (later, False)):
        block = report["blocks"][0]
        explicit = next(row for row in block["rows"] if row["variant"] == "explicit")
        assert (block["matmul_peak_gflops"] is not None) == measured
        assert (explicit["forward_pct_peak"] is not None) == measured
        assert (explicit["max_abs_dlogp"] is not None) == measured
        assert explicit["forward_ms"] is not None and explicit["train_ms"] is not None
    pooled = processes.pool([first, later])["blocks"][0]
    assert pooled["matmul_peak_gflops"] == first["blocks"][0]["matmul_peak_gflops"]
    explicit = next(row for row in pooled["rows"] if row["variant"] == "explicit")
    assert explicit["max_abs_dlogp"] == first["blocks"][0]["rows"][0]["max_abs_dlogp"]
    assert explicit["forward_pct_peak"] is not None


def small_gemm_shapes(*args) -> list[tuple[int, int, int]]:
    return [(4, 4, 4)]


def skip_memory(*args) -> None:
    pass


def test_a_process_reports_each_phase_on_its_stderr(monkeypatch, capsys):
    """The worker's side: run's phases become PHASE_DONE lines on stderr, the report stays alone
    on stdout."""
    def fake_run(settings, on_phase, on_timed):
        for _ in range(4):
            on_phase()
        on_timed()
        on_phase()
        return {"meta": {"order_seed": settings.order_seed}, "blocks": []}

    monkeypatch.setattr(processes, "run", fake_run)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(pickle.dumps(three_processes()))))
    assert processes.main() == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [processes.PHASE_DONE] * 4 + [processes.TIMED, processes.PHASE_DONE]
    assert json.loads(out) == {"meta": {"order_seed": 0}, "blocks": []}


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_a_fresh_process_imports_no_compiler_it_does_not_use():
    """Every default run starts four interpreters; inductor, which only --compile uses, took
    about 2 s of each one's imports, so the worker's module must not load it."""
    probe = ("import sys, benchmarks.compare.processes, compare; "
             "sys.exit('torch._inductor.compile_fx' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).parents[3])
    assert done.returncode == 0


@pytest.fixture
def starts(monkeypatch, counted):
    """Every interpreter run_processes starts, with how many phases its bar (a ``counted`` one)
    had counted then."""
    made = []
    start = processes.start_process

    def counted_start():
        child = start()
        made.append((counted.made[-1].n if counted.made else 0, child))
        return child
    monkeypatch.setattr(processes, "start_process", counted_start)
    return made


def test_the_next_interpreter_starts_when_the_current_ones_timing_is_over(interpreter, counted, starts):
    """Process 1 says its timing is over after 3 of its 5 phases (its peak memory and report
    follow): process 2's interpreter starts then and imports while process 1 ends, and is handed
    its settings only after. Process 2 never says so: process 3 starts once it has ended."""
    made = starts
    handed = interpreter([{"phases": 5, "timed_at": 3}, {"phases": 4}, {"phases": 4, "timed_at": 4}])
    report = processes.run_processes(three_processes(), progress=counted)
    assert [at for at, _ in made] == [0, 3, 9]  # no fourth: nothing follows the last process
    assert all(child.poll() is not None for _, child in made)
    assert sorted(os.listdir(handed)) == ["0.pickle", "1.pickle", "2.pickle"]
    assert report["meta"]["processes"] == 3


def test_an_interpreter_started_ahead_is_ended_when_the_current_process_fails(interpreter, counted, starts):
    made = starts
    handed = interpreter([{"phases": 13, "timed_at": 12},
                          {"phases": 2, "timed_at": 1, "error": "ValueError: x"}])
    with pytest.raises(RuntimeError, match="process 2 of 3 failed: ValueError: x"):
        processes.run_processes(three_processes(), progress=counted)
    assert len(made) == 3  # the third started at the second's timing-done line...
    assert all(child.poll() is not None for _, child in made)  # ...and ended with the run
    assert sorted(os.listdir(handed)) == ["0.pickle", "1.pickle"]  # never handed its settings


def test_run_says_its_timing_is_over_once_after_the_last_rounds_and_before_the_memory(monkeypatch):
    """Two blocks: the timing-done call comes once, after the second block's last round, with
    only its peak memory phase left (which times nothing)."""
    monkeypatch.setattr(run_module, "gemm_shapes", small_gemm_shapes)
    monkeypatch.setattr(run_module, "measure_memory", skip_memory)
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    settings = Settings(config=config, shapes=(Shape(2, 8, 6), Shape(2, 6, 6)), variants=("explicit",),
                        rounds=1, min_run_time=0.001, decode_len=1, threads=1, keep_freed_memory=False,
                        replace_weights=False, show_progress=False)
    events = []
    run_module.run(settings, on_phase=lambda: events.append("phase"),
                   on_timed=lambda: events.append("timed"))
    assert events.count("timed") == 1
    assert events[-2:] == ["timed", "phase"]  # the memory phase alone follows
    assert events.count("phase") == run_module.total_phases(settings)
