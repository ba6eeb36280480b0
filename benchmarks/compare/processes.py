"""``--processes N``: the whole measurement repeated in N fresh interpreters, their rounds pooled.

    report = run_processes(settings)   # settings.processes fresh processes, one report

A process's threads' placement and its allocator's state hold for all of its rounds (where its
weights lie is drawn anew every round: ``benchmarks.compare.placement``), so one process's rounds share
them and its interval cannot see them vary. Each process
here runs ``benchmarks.compare.run.run`` on the same settings (its rounds' orders seeded by its index),
writes its report as JSON, and the reports are pooled: every row's rounds concatenated with
the index of the process that timed them, so that each ratio's interval resamples processes
and then rounds (``benchmarks.compare.ratios``), and its times are the median of the processes'.

Progress: each process runs without a bar of its own and writes ``PHASE_DONE`` on a line of
its stderr as each phase of its run ends; the parent, which knows every process's phases in
advance (``benchmarks.compare.run.total_phases``), moves one bar over them all. The report, on
stdout, is read beside stderr, so that a large one cannot stall the process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import pickle
import signal
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable
from functools import partial
from typing import IO

from tqdm import tqdm

from benchmarks.compare.report import add_ratios
from benchmarks.compare.run import run, total_phases
from benchmarks.compare.settings import Settings

# a row's fields that are one process's measurements: pooled as the median over processes
MEASURED_SUFFIXES = ("_ms", "_iqr_ms", "_tokens_per_s", "_gflops", "_pct_peak", "_peak_mb",
                     "_page_faults_per_step")


# how run_processes starts a process: the interpreter's arguments after its own path
WORKER = ("-m", "benchmarks.compare.processes")
# the line a process writes to its stderr as each phase of its run ends (its other lines are its own)
PHASE_DONE = "benchmarks.compare.processes: phase done"
# the line it writes once its last round is timed: what it does after (the first's peak memory,
# its report) times nothing, so the next process's interpreter may start and import meanwhile
TIMED = "benchmarks.compare.processes: timing done"


def run_processes(settings: Settings, progress: Callable[..., tqdm] = tqdm) -> dict:
    """``settings`` measured in ``settings.processes`` fresh interpreters, one after another;
    the pooled report. Peak memory and cache bytes, the same in every process, the log-prob check
    and the matmul peak, which the pooled report takes from the first, are measured in the first
    alone (``Settings.measure_shared``). One bar, made by ``progress`` (tqdm's arguments) and
    shown unless ``settings.show_progress`` is off, counts every process's phases and is gone
    when they end. A process that fails raises RuntimeError with its last line of stderr
    (``failure``)."""
    each = [settings_of(settings, index) for index in range(settings.processes)]
    reports = []
    started: list[subprocess.Popen] = []  # the current process, then the next once started
    with progress(total=sum(total_phases(one) for one in each), disable=not settings.show_progress,
                  unit="phase", leave=False, dynamic_ncols=True) as bar:
        try:
            started.append(start_process())
            for index, one in enumerate(each):
                bar.set_description_str(f"process {index + 1} of {len(each)}")

                def start_next(index: int = index) -> None:  # its timing is over: the next imports
                    if index + 1 < len(each) and len(started) == 1:
                        started.append(start_process())
                returncode, out, last = run_one(started[0], one, bar, on_timed=start_next)
                if returncode != 0:
                    raise RuntimeError(f"process {index + 1} of {len(each)} failed: "
                                       f"{failure(returncode, last)}")
                reports.append(json.loads(out))
                started.pop(0)
                if not started and index + 1 < len(each):
                    started.append(start_process())
        finally:
            for child in started:  # one started ahead and never handed its settings
                stop(child)
    return pool(reports)


def start_process() -> subprocess.Popen:
    """A fresh interpreter running the worker: it imports, then waits for its settings on stdin."""
    return subprocess.Popen([sys.executable, *WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def stop(child: subprocess.Popen) -> None:
    """End ``child`` if it still runs, and close its pipes."""
    if child.poll() is None:
        child.kill()
    child.wait()
    for pipe in (child.stdin, child.stdout, child.stderr):
        with contextlib.suppress(OSError):
            pipe.close()


def settings_of(settings: Settings, index: int) -> Settings:
    """What process ``index`` of ``run_processes`` runs: one process, its rounds' orders seeded by
    its index, no bar of its own, what the pooled report keeps of the first (``measure_shared``:
    peak memory, the log-prob check, the matmul peak) measured in the first alone."""
    return dataclasses.replace(settings, order_seed=index, processes=1, show_progress=False,
                               measure_shared=settings.measure_shared and index == 0)


def run_one(child: subprocess.Popen, settings: Settings, bar: tqdm,
            on_timed: Callable[[], None] = lambda: None) -> tuple[int, bytes, str]:
    """``child``, a fresh process (``start_process``), handed ``settings``: each ``PHASE_DONE``
    line of its stderr counted on ``bar`` and ``on_timed`` called at its ``TIMED`` line, while
    its stdout is read apart; its exit status, stdout, and last other line of stderr ("" if
    none). The child is ended and its pipes closed on return, or on any exception."""
    out: list[bytes] = []
    feeding = threading.Thread(target=feed_and_read, daemon=True,
                               args=(child.stdin, pickle.dumps(settings), child.stdout, out))
    last = ""
    try:
        feeding.start()
        for raw in child.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line == PHASE_DONE:
                bar.update()
            elif line == TIMED:
                on_timed()
            elif line:
                last = line
        feeding.join()
        returncode = child.wait()
    finally:  # the parent interrupted: the child does not outlive it
        stop(child)
    return returncode, b"".join(out), last


def feed_and_read(stdin: IO[bytes], data: bytes, stdout: IO[bytes], out: list[bytes]) -> None:
    """Hand a process its settings, then read its stdout to the end into ``out``."""
    with contextlib.suppress(BrokenPipeError):  # it ended before reading them: its stderr and
        stdin.write(data)  # exit status tell why
    with contextlib.suppress(BrokenPipeError):
        stdin.close()
    out.append(stdout.read())


def failure(returncode: int, last: str) -> str:
    """Why a process failed, in one line: its last line of stderr, and the signal that killed it."""
    if returncode >= 0:
        return last or f"no message, exit status {returncode}"
    try:
        killed = f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        killed = f"killed by signal {-returncode}"
    return f"{killed}; last line on stderr: {last}" if last else killed


def pool(reports: list[dict]) -> dict:
    """One report from several processes' reports of the same settings; ValueError for no
    reports, or reports whose blocks do not match."""
    if not reports:
        raise ValueError("pool needs at least one report, got none")
    first = reports[0]
    counts = [len(report["blocks"]) for report in reports]
    if len(set(counts)) > 1:
        raise ValueError(f"pool needs reports of the same settings: their block counts differ ({counts})")
    meta = {**first["meta"], "processes": sum(report["meta"].get("processes") or 1 for report in reports),
            "contended": any(report["meta"]["contended"] for report in reports)}
    blocks = [pool_block([report["blocks"][index] for report in reports], meta["order_seed"])
              for index in range(len(first["blocks"]))]
    return {"meta": meta, "blocks": blocks}


def pool_block(blocks: list[dict], seed: int) -> dict:
    """One block from the processes' copies of it: rows and control pooled, the rounds' record
    concatenated, the ratios made again over every process's rounds."""
    pooled = {**blocks[0]}
    # a block that is itself pooled keeps its processes apart: its labels shifted past the others'
    inner = [block["rounds"].get("process") or [0] * len(block["rounds"]["orders"]) for block in blocks]
    offsets = list(itertools.accumulate((max(labels, default=0) + 1 for labels in inner[:-1]), initial=0))
    pooled["rows"] = [pool_row([block["rows"][index] for block in blocks], offsets)
                      for index in range(len(blocks[0]["rows"]))]
    if blocks[0].get("control"):
        pooled["control"] = pool_row([block["control"] for block in blocks], offsets)
    pooled["rounds"] = {"orders": [order for block in blocks for order in block["rounds"]["orders"]],
                        "seed": [seed for block in blocks for seed in as_list(block["rounds"]["seed"])],
                        "others": [value for block in blocks for value in block["rounds"]["others"]],
                        "contended": [flag for block in blocks for flag in block["rounds"]["contended"]],
                        "replace_s": [seconds for block in blocks
                                      for seconds in block["rounds"].get("replace_s", [])],
                        "process": [offset + label for offset, labels in zip(offsets, inner, strict=True)
                                    for label in labels]}
    add_ratios(pooled, seed)
    return pooled


def as_list(value: object) -> list:
    """A pooled block's list of seeds as it is, one process's seed as a list of one."""
    return value if isinstance(value, list) else [value]


def pool_row(rows: list[dict], offsets: list[int]) -> dict:
    """A row from its processes' copies: each mode's rounds concatenated with their process
    index (``{mode}_rounds_process``: a copy's own labels, if it was pooled, shifted by its
    offset), its measured fields the median of the copies' where every copy measured them (peak
    memory, measured by the first alone, is the first's), an error if any copy had one."""
    pooled = {**rows[0]}
    for key in rows[0]:
        values = [row.get(key) for row in rows]
        if key.endswith("_rounds_s"):
            pooled[key] = [seconds for row in rows for seconds in row[key]]
            labels = key.replace("_rounds_s", "_rounds_process")
            pooled[labels] = [offset + label for row, offset in zip(rows, offsets, strict=True)
                              for label in row.get(labels) or [0] * len(row[key])]
        elif key.endswith("_error"):
            pooled[key] = next((value for value in values if value), None)
        elif key.endswith(MEASURED_SUFFIXES) and all(isinstance(value, (int, float)) for value in values):
            pooled[key] = statistics.median(values)
    return pooled


def main() -> int:
    """One process of ``run_processes``: pickled settings on stdin, the JSON report on stdout,
    a ``PHASE_DONE`` line on stderr as each phase ends."""
    settings = pickle.load(sys.stdin.buffer)
    sys.stdout.write(json.dumps(run(settings, on_phase=partial(tell, PHASE_DONE),
                                    on_timed=partial(tell, TIMED))))
    return 0


def tell(line: str) -> None:
    """Tell the parent ``line`` (``PHASE_DONE``, ``TIMED``) on a line of stderr."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
