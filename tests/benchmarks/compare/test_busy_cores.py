"""Measuring on a shared machine: the busy-core reading (benchmarks.compare.machine) from injected
/proc/stat readings, the thread choice and its one line, the unsteady-cell mark in the table,
JSON and CSV, the busy header and the contention line, the OpenMP wait policy reaching the
process, and one real busy core (a pinned spinner) seen by the detection."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn
from torch.utils.benchmark.utils.common import Measurement, TaskSpec

import benchmarks.compare.machine
import compare
from benchmarks.compare.machine import (
    CoreLoad,
    CpuSample,
    between,
    choose_threads,
    during,
    look,
    parse_proc_stat,
    read_sample,
    settle_threads,
    wait_policy_environment,
)
from benchmarks.compare.measured import Cell, Row
from benchmarks.compare.render import render
from benchmarks.compare.report import block_result, meta, row_result
from benchmarks.compare.run import CONTROL
from benchmarks.compare.settings import Settings
from benchmarks.compare.timing import Peak
from benchmarks.compare.workload import TIMING_PRESETS, Shape
from common.config import TransformerConfig

ROOT = Path(__file__).resolve().parents[3]

# --- reading /proc/stat ---------------------------------------------------------------------

# columns: user nice system idle iowait irq softirq steal guest guest_nice
PROC_STAT = """cpu  300 0 0 300 0 0 0 0 0 0
cpu0 100 5 10 50 5 1 2 3 7 0
cpu1 20 0 0 170 10 0 0 0 0 0
intr 12345
"""


def test_proc_stat_busy_and_total_ticks_per_cpu():
    busy, total = parse_proc_stat(PROC_STAT, [0, 1])
    # cpu0: total 100+5+10+50+5+1+2+3 = 176 (guest inside user), idle+iowait = 55
    assert busy == (176 - 55, 200 - 180) and total == (176, 200)
    assert parse_proc_stat(PROC_STAT, [1]) == ((20,), (200,))  # only the CPUs asked for


def test_proc_stat_without_the_cpus_line_names_it():
    with pytest.raises(ValueError, match="cpu3"):
        parse_proc_stat(PROC_STAT, [0, 3])
    with pytest.raises(ValueError, match="cpu0"):
        parse_proc_stat("cpu0 1 2 3\n", [0])  # too few columns


def sample(busy: tuple[int, ...], total: tuple[int, ...], own_s: float, wall_s: float) -> CpuSample:
    return CpuSample(busy, total, own_s, wall_s, load=0.5)


def test_others_use_is_the_busy_share_summed_less_this_process():
    before = sample((0, 0), (0, 0), own_s=0.0, wall_s=10.0)
    # over 1 s: cpu0 busy 100 of 100 ticks, cpu1 30 of 100; this process used 0.2 s of CPU
    after = sample((100, 30), (100, 100), own_s=0.2, wall_s=11.0)
    load = between(before, after)
    assert load.cpus == 2 and load.window_s == pytest.approx(1.0)
    assert load.others == pytest.approx(1.0 + 0.3 - 0.2)
    busy_self = sample((50, 50), (100, 100), own_s=1.5, wall_s=11.0)  # all of it ours
    assert between(before, busy_self).others == 0.0


def test_samples_out_of_order_or_of_other_cpus_are_refused():
    before = sample((0, 0), (0, 0), 0.0, 10.0)
    with pytest.raises(ValueError, match="later"):
        between(before, sample((1, 1), (2, 2), 0.0, 10.0))
    with pytest.raises(ValueError, match="2 and 1 CPUs"):
        between(before, sample((1,), (2,), 0.0, 11.0))


@pytest.mark.parametrize(("others", "free"), [(0.0, 2), (0.05, 2), (0.19, 2), (0.21, 1), (1.0, 1),
                                              (1.2, 1), (1.25, 0), (2.0, 0), (3.5, 0)])
def test_free_cores_count_a_fifth_of_a_core_used_by_others_as_taken(others, free):
    # the rule by hand: each started 0.2 of a core beyond the first 0.2 takes a whole core
    assert CoreLoad(cpus=2, others=others, window_s=0.3, load=None).free == free


def test_look_sleeps_the_window_between_two_readings():
    readings = iter([sample((0, 0), (0, 0), 0.0, 5.0), sample((30, 0), (30, 30), 0.0, 5.3)])
    slept = []
    load = look(0.3, read=lambda: next(readings), sleep=slept.append)
    assert slept == [0.3] and load.others == pytest.approx(1.0) and load.free == 1
    assert look(0.3, read=lambda: None, sleep=slept.append) is None  # no /proc/stat


def test_a_real_reading_of_this_process_cpus():
    reading = read_sample()
    if reading is None:
        pytest.skip("no /proc/stat here")
    assert len(reading.busy_ticks) == len(os.sched_getaffinity(0))
    assert all(0 <= b <= t for b, t in zip(reading.busy_ticks, reading.total_ticks, strict=True))


# --- choosing the threads -------------------------------------------------------------------

IDLE = CoreLoad(cpus=2, others=0.03, window_s=0.3, load=0.1)
ONE_BUSY = CoreLoad(cpus=2, others=0.98, window_s=0.3, load=1.02)
ALL_BUSY = CoreLoad(cpus=2, others=2.0, window_s=0.3, load=2.5)


def test_an_idle_machine_keeps_the_default_and_says_so_quietly():
    choice = choose_threads(IDLE, requested=None, default=2)
    assert (choice.threads, choice.busy, choice.contended) == (2, False, False)
    assert choice.line == "2 threads: 2 of 2 cores free (others used 0.03 cores over 0.3 s; load 0.10)"


def test_a_busy_core_cuts_the_default_to_the_free_cores_and_says_why():
    choice = choose_threads(ONE_BUSY, requested=None, default=2)
    assert (choice.threads, choice.busy, choice.contended) == (1, True, False)
    assert choice.line.startswith("1 thread, not 2: 1 of 2 cores free (others used 0.98 cores over "
                                  "0.3 s; load 1.02)")
    assert "--threads 2 to insist" in choice.line
    assert choose_threads(ONE_BUSY, None, default=1).threads == 1  # never above the default


def test_no_free_core_still_times_with_one_thread_and_calls_the_run_contended():
    choice = choose_threads(ALL_BUSY, requested=None, default=2)
    assert (choice.threads, choice.contended) == (1, True)
    assert "0 of 2 cores free" in choice.line and "inflated" in choice.line


def test_an_explicit_thread_count_is_kept_with_a_warning_when_its_cores_are_busy():
    choice = choose_threads(ONE_BUSY, requested=2, default=2)
    assert (choice.threads, choice.requested, choice.contended) == (2, 2, True)
    assert choice.line.startswith("warning: --threads 2 with 1 of 2 cores free (others used 0.98")
    quiet = choose_threads(ONE_BUSY, requested=1, default=2)  # one thread fits the free core
    assert (quiet.threads, quiet.line, quiet.contended) == (1, None, False)
    assert choose_threads(IDLE, requested=2, default=2).line is None


def test_bad_thread_counts_are_refused():
    with pytest.raises(ValueError, match="requested=0"):
        choose_threads(IDLE, requested=0, default=2)


def test_one_thread_needs_no_look_and_more_do():
    def forbidden():
        raise AssertionError("looked at the cores for a one-thread run")

    assert settle_threads(1, 2, observe=forbidden).threads == 1
    assert settle_threads(None, 1, observe=forbidden).before is None
    assert settle_threads(None, 2, observe=lambda: ONE_BUSY).threads == 1


def test_the_reading_across_a_run_says_whether_others_competed():
    before = sample((0, 0), (0, 0), 0.0, 0.0)
    after = sample((1000, 200), (1000, 1000), own_s=10.0, wall_s=10.0)  # others: 1.2 - 1.0
    assert during(before, after, threads=2) == {
        "others_during": pytest.approx(0.2), "free_during": 2, "cpus": 2, "run_s": 10.0,
        "load_after": 0.5, "contended_during": False}
    busy = sample((1000, 1000), (1000, 1000), own_s=10.0, wall_s=10.0)  # others: a whole core
    assert during(before, busy, threads=2)["contended_during"]
    assert not during(before, busy, threads=1)["contended_during"]
    assert during(None, busy, threads=1) is None


# --- the OpenMP wait policy -----------------------------------------------------------------


def test_the_wait_policy_option_goes_to_the_environment_before_torch(monkeypatch):
    monkeypatch.setattr(benchmarks.compare.machine, "DEFAULT_WAIT_POLICY", None)
    assert wait_policy_environment(["--omp-wait-policy", "passive"], {}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_policy_environment(["--omp-wait-policy=active", "--quiet"], {"OMP_WAIT_POLICY": "PASSIVE"}) \
        == {"OMP_WAIT_POLICY": "ACTIVE"}  # the option wins over the environment
    assert wait_policy_environment(["--quiet"], {}) == {}  # OpenMP's own policy
    assert wait_policy_environment(["--omp-wait-policy", "sometimes"], {}) == {}  # the parser refuses it
    assert wait_policy_environment(["--omp-wait-policy"], {}) == {}  # no exit here either
    monkeypatch.setattr(benchmarks.compare.machine, "DEFAULT_WAIT_POLICY", "passive")
    assert wait_policy_environment([], {}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_policy_environment([], {"OMP_WAIT_POLICY": "ACTIVE"}) == {}  # the user's stays


def test_a_wait_policy_asked_after_torch_loaded_is_refused(monkeypatch, capsys):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with pytest.raises(SystemExit) as stop:
        compare.parse_args(["--preset", "tiny", "--omp-wait-policy", "passive"])
    assert stop.value.code == 2
    assert "--omp-wait-policy passive: torch was loaded before" in capsys.readouterr().err


@pytest.mark.slow  # a fresh interpreter importing torch (2 s idle, 18 s on a busy machine)
def test_the_wait_policy_reaches_the_openmp_runtime():
    """libgomp prints its settings as it loads (OMP_DISPLAY_ENV), i.e. when compare.py imports
    torch: the policy it read is the option's, over the environment's ACTIVE."""
    env = os.environ | {"OMP_DISPLAY_ENV": "TRUE", "OMP_WAIT_POLICY": "ACTIVE"}
    done = subprocess.run([sys.executable, "compare.py", "--omp-wait-policy", "passive", "--help"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in done.stderr


# --- rounds that disagree, in the table, JSON and CSV -----------------------------------------


def timed_cell(rounds: list[float]) -> Cell:
    """A cell as three timed rounds leave it: their medians, and the merged measurement."""
    spec = TaskSpec(stmt="step()", setup="pass")
    return Cell(measurement=Measurement(1, list(rounds), spec), rounds=list(rounds), calls=3)


STEADY, UNSTEADY = [1.0, 1.01, 0.99], [1.0, 1.0, 3.0]
TINY_CONFIG = TransformerConfig(**TIMING_PRESETS["tiny"].fields)


def report_with(rounds: dict[str, dict[str, list[float]]], cores: dict | None = None,
                contended: bool = False, scale: float = 1.0, threads: int = 2,
                rounds_record: dict | None = None) -> dict:
    """A one-block report whose rows' rounds are given (variant -> mode -> round seconds; the
    variant ``CONTROL`` is the control), through the report's own row_result, block_result and
    meta; ``scale`` multiplies every time; ``rounds_record`` is the block's record of its rounds."""
    settings = Settings(config=TINY_CONFIG, shapes=(Shape(2, 8, 6),), preset="tiny", decode_len=1,
                        threads=threads, variants=tuple(name for name in rounds if name != CONTROL),
                        show_progress=False)
    rows = {name: Row(name, nn.Linear(2, 2), cells={mode: timed_cell([scale * s for s in seconds])
                                                    for mode, seconds in modes.items()})
            for name, modes in rounds.items()}
    peak = Peak(1e12, 1e10, (1e12,), (8, 8, 8), {(8, 8, 8): 1e12})
    rows["torch"].fast_path = True  # as on CPU here; its note's other form is a longer line
    results = [row_result(row, settings, Shape(2, 8, 6), peak.flops_per_second) for row in rows.values()]
    control = next((result for result in results if result["variant"] == CONTROL), None)
    block = block_result("cpu", "float32", Shape(2, 8, 6), peak,
                         [result for result in results if result is not control], control=control,
                         rounds=rounds_record or {}, float32_matmul_precision="IEEE float32")
    report = {"meta": meta(settings, "glibc default"), "blocks": [block]}
    report["meta"]["cores"], report["meta"]["contended"] = cores or {}, contended
    return report


def table_cells(text: str) -> dict[str, list[str]]:
    """variant -> its github-table cells."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in lines[1:])}


BUSY_CORES = {"threads": 2, "requested": 2, "default": 2, "cpus": 2, "others_before": 0.98,
              "free_before": 1, "window_s": 0.3, "load_before": 1.02, "busy_before": True,
              "contended_before": True, "others_during": 1.01, "free_during": 1, "run_s": 20.0,
              "load_after": 1.1, "contended_during": True}


def test_a_contended_run_says_so_first_and_the_header_gives_the_load_and_threads():
    steady = {"explicit": {"forward": STEADY, "train": STEADY}, "torch": {"forward": STEADY, "train": STEADY}}
    lines = render(report_with(steady, BUSY_CORES, contended=True), "github").splitlines()
    assert lines[0] == ("warning: timed on busy cores: 2 threads, 1 of 2 cores free during the run; "
                        "times inflated, ratios unreliable")
    assert max(map(len, lines)) <= 120
    assert lines[2].startswith("cpu: ") and "matmul peak" in lines[3]
    assert lines[4] == ("busy cores (2 here): others used 0.98 before timing, 1.01 during the run "
                        "(load 1.10); --threads 2 as asked")
    chosen = BUSY_CORES | {"requested": None, "threads": 1, "contended_before": False,
                           "contended_during": False}
    lines = render(report_with(steady, chosen, threads=1), "github").splitlines()
    assert lines[0] == ("note: timed with 1 thread, not 2, as others held cores: these ratios are for "
                        "that count and may differ from an idle run's")
    assert lines[2].startswith("cpu: ") and lines[4].endswith("; 1 thread, not 2")
    idle = render(report_with(steady, {"cpus": 2, "others_during": 0.02, "free_during": 2}), "github")
    assert "busy cores" not in idle and "warning" not in idle
    assert render(report_with(steady, BUSY_CORES, contended=True), "csv").splitlines()[1].endswith(",True")


# --- compare.py adapts, and a real busy core --------------------------------------------------


def test_compare_runs_with_the_threads_the_check_chose_and_says_why(monkeypatch, capsys):
    """compare.py's main with the core check and the run replaced: what it hands the run, and
    what it prints, though --quiet."""
    handed = []
    one_of_four_busy = CoreLoad(cpus=4, others=1.0, window_s=0.3, load=1.0)  # unlike this process's 1
    monkeypatch.setattr(compare, "settle_threads",
                        lambda requested, default: choose_threads(one_of_four_busy, requested, default=4))
    monkeypatch.setattr(compare, "run", lambda settings: handed.append(settings) or report_with(
        {"torch": {"forward": STEADY, "train": STEADY}}, BUSY_CORES, contended=True))
    assert compare.main(["--preset", "tiny", "--processes", "1", "--quiet", "--format", "json"]) == 0
    (settings,) = handed
    assert settings.threads == 3 and settings.thread_choice.before == one_of_four_busy
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("compare.py: 3 threads, not 4: 3 of 4 cores free")
    assert err[1].startswith("compare.py: warning: timed on busy cores")  # json: not in the table
    compare.main(["--preset", "tiny", "--processes", "1", "--quiet", "--threads", "4"])
    assert handed[-1].threads == 4 and handed[-1].thread_choice.contended
    captured = capsys.readouterr()
    assert captured.err.startswith("compare.py: warning: --threads 4 with 3 of 4 cores free")
    assert captured.out.startswith("warning: timed on busy cores")  # the table's first line


SPINNER = """import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
print("spinning", flush=True)
while True:
    pass
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2
                    or read_sample() is None, reason="needs two CPUs, affinity and /proc/stat")
def test_a_core_held_by_a_spinning_process_is_seen_and_left_out():
    cpus = sorted(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", SPINNER, str(cpus[0])], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert spinner.stdout.readline().strip() == "spinning"
        load = look()
    finally:
        spinner.kill()
        spinner.wait()
    assert load.others >= 0.8  # the spinner's core, whatever else runs here
    chosen = choose_threads(load, requested=None, default=len(cpus))
    assert chosen.threads <= len(cpus) - 1 and chosen.busy
    assert f"{chosen.threads} thread" in chosen.line and f"of {len(cpus)} cores free" in chosen.line
    insisted = choose_threads(load, requested=len(cpus), default=len(cpus))
    assert insisted.threads == len(cpus) and insisted.contended
    assert insisted.line.startswith(f"warning: --threads {len(cpus)} with ")


def test_compare_sets_the_wait_policy_before_anything_imports_torch():
    """The slow test above proves the policy reaches libgomp; this one keeps the cheap half by
    default: everything compare.py imports above its ``os.environ.update`` line loads without
    torch (which would load OpenMP, and read the policy, first)."""
    tree = ast.parse((ROOT / "compare.py").read_text(encoding="utf-8"))
    early = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and "os.environ.update" in ast.unparse(node):
            break
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            early.append(node.module)
        elif isinstance(node, ast.Import):
            early.extend(alias.name for alias in node.names)
    else:
        raise AssertionError("compare.py never sets the wait policy")
    probe = f"import sys, {', '.join(early)}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], cwd=ROOT).returncode == 0, early


@pytest.mark.parametrize("policy", benchmarks.compare.machine.WAIT_POLICIES)
def test_the_wait_policy_check_reads_the_environment_in_any_case(policy):
    """OpenMP reads OMP_WAIT_POLICY without regard to case: every spelling of the option's
    policy passes the check, the other policy or none at all does not."""
    other = next(p for p in benchmarks.compare.machine.WAIT_POLICIES if p != policy)
    for spelling in (policy, policy.upper(), policy.capitalize()):
        problem = benchmarks.compare.machine.wait_policy_problem(policy, {"OMP_WAIT_POLICY": spelling})
        assert problem is None, spelling
    for environ in ({"OMP_WAIT_POLICY": other.upper()}, {"OMP_WAIT_POLICY": other}, {}):
        problem = benchmarks.compare.machine.wait_policy_problem(policy, environ)
        said = f"--omp-wait-policy {policy}: torch was loaded"
        assert problem is not None and problem.startswith(said), environ
    # nothing asked, nothing to check
    assert benchmarks.compare.machine.wait_policy_problem(None, {"OMP_WAIT_POLICY": other}) is None


@pytest.mark.parametrize("policy", benchmarks.compare.machine.WAIT_POLICIES)
def test_what_the_early_reader_sets_is_what_the_check_accepts(policy, monkeypatch):
    """Each spelling of the option the early reader takes (two words or one, any case) becomes
    the upper-case variable OpenMP reads, which the later check then accepts."""
    monkeypatch.setattr(benchmarks.compare.machine, "DEFAULT_WAIT_POLICY", None)
    for argv in (["--omp-wait-policy", policy], [f"--omp-wait-policy={policy}"],
                 ["--omp-wait-policy", policy.upper()],
                 ["--quiet", f"--omp-wait-policy={policy.capitalize()}"]):
        environ = {"OMP_WAIT_POLICY": "SOMETHING"}
        added = wait_policy_environment(argv, environ)
        assert added == {"OMP_WAIT_POLICY": policy.upper()}, argv
        assert benchmarks.compare.machine.wait_policy_problem(policy, {**environ, **added}) is None, argv


def test_json_output_puts_every_warning_line_on_stderr(monkeypatch, capsys):
    """With --format json the table has no first line to warn in: the busy rounds and the cut
    thread count go to stderr, as the contended run's warning does."""
    record = {"orders": [["torch"]] * 3, "seed": 0, "others": [0.0, 0.6, 0.0],
              "contended": [False, True, False]}
    chosen = BUSY_CORES | {"requested": None, "threads": 1, "contended_before": False,
                           "contended_during": False}
    monkeypatch.setattr(compare, "settle_threads", lambda requested, default: choose_threads(None, 1, 1))
    monkeypatch.setattr(compare, "run", lambda settings: report_with(
        {"torch": {"forward": STEADY, "train": STEADY}}, chosen, threads=1, rounds_record=record))
    assert compare.main(["--preset", "tiny", "--processes", "1", "--quiet", "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "compare.py: warning: 1 of 3 rounds ran on busy cores" in err
    assert "compare.py: note: timed with 1 thread, not 2" in err

