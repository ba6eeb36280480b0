"""Whether the cores a measurement will use are free, and how many threads to time with.

    choice = choose_threads(look(), requested=None, default=2)   # look() sleeps SAMPLE_SECONDS
    print(choice.line)   # "1 thread, not 2: 1 of 2 cores is busy (...)"

With as many OpenMP threads as cores, every operator's parallel region ends at a barrier that
waits for its slowest thread; when another process holds one of the cores, the thread there
is descheduled and the barrier waits a time slice, at every operator. Rows made of many small
operators then slow down tens of times while a row of a few fused kernels barely notices, and
the ratios between rows say nothing about the code. So before timing, each measuring entry point
reads the busy time of the CPUs this process may run on (``/proc/stat``, less this process's
own CPU time) over a short window and times with no more threads than there are free cores;
a count the user asked for is kept, with a warning when its cores are busy. The same reading
across a whole run (``during``) says whether others competed while it ran.

This module does not import torch: compare.py calls ``wait_policy_environment`` before torch
loads its OpenMP runtime, which reads ``OMP_WAIT_POLICY`` once, when it loads.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from benchmarks.engines import isolated

# How long ``look`` watches the cores. /proc/stat counts in ticks of 1/100 s, so a third of a
# second gives each CPU about 30 ticks: a core held by another process reads ~1.0, an idle one
# ~0.0, well apart; longer only delays every run.
SAMPLE_SECONDS = 0.3
# A core counts as taken once other processes use more than this share of it. Even a fifth of
# a core costs a multi-threaded row more than its second thread gains: one operator in five
# then waits a whole time slice (milliseconds) at its barrier, against operators that take
# tenths of a millisecond. An otherwise idle machine reads a few hundredths (daemons, the kernel).
TAKEN_SHARE = 0.2
# /proc/stat's per-CPU columns: user nice system idle iowait irq softirq steal (guest and
# guest_nice are already inside user and nice). Steal is time the hypervisor gave to someone
# else: busy, for a measurement.
IDLE_COLUMNS = (3, 4)  # idle, iowait
COUNTED_COLUMNS = 8


@dataclass(frozen=True)
class CpuSample:
    """One reading of the CPUs this process may use, to be differenced with a later one."""

    busy_ticks: tuple[int, ...]  # per CPU: ticks spent not idle, since boot
    total_ticks: tuple[int, ...]  # per CPU: all ticks since boot
    own_cpu_s: float  # this process's CPU time (all its threads) and that of the engines it ran
    # in processes of their own, alive or ended (benchmarks.engines.isolated), own_cpu_seconds()
    wall_s: float  # time.monotonic()
    load: float | None  # the 1-minute load average of the whole machine, if known


@dataclass(frozen=True)
class CoreLoad:
    """What other processes did with this process's CPUs over one window."""

    cpus: int  # CPUs this process may run on (os.sched_getaffinity)
    others: float  # cores' worth of CPU time other processes used, on average over the window
    window_s: float  # the window's length
    load: float | None  # the 1-minute load average at its end (whole machine; context only)

    @property
    def free(self) -> int:
        """Cores not taken by others: each started TAKEN_SHARE of a core used by others takes one."""
        taken = max(0, math.ceil(self.others - TAKEN_SHARE))
        return max(0, self.cpus - taken)

    def describe(self) -> str:
        """``others used 0.98 cores over 0.3 s; load 1.02``."""
        load = f"; load {self.load:.2f}" if self.load is not None else ""
        return f"others used {self.others:.2f} cores over {self.window_s:.1f} s{load}"


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a measurement runs with, and why."""

    threads: int  # what the run uses
    requested: int | None  # what the user asked for (--threads), None: chosen here
    default: int  # what the run would use on an idle machine
    before: CoreLoad | None  # the cores before timing; None when not looked at (one thread)
    line: str | None  # the one line to print (stderr); None when there is nothing to say
    busy: bool  # whether other processes held any of this process's cores before timing
    contended: bool  # whether the run's threads outnumber the free cores

    def as_dict(self) -> dict:
        """The choice for the report's meta section."""
        before = self.before
        return {"threads": self.threads, "requested": self.requested, "default": self.default,
                "cpus": before.cpus if before else None,
                "others_before": before.others if before else None,
                "free_before": before.free if before else None,
                "window_s": before.window_s if before else None,
                "load_before": before.load if before else None,
                "busy_before": self.busy, "contended_before": self.contended, "note": self.line}


def parse_proc_stat(text: str, cpus: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Busy and total ticks of each CPU in ``cpus`` from /proc/stat's text. ValueError naming
    the CPU when its line is missing or short."""
    lines = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit():
            lines[int(name[3:])] = rest.split()
    busy, total = [], []
    for cpu in cpus:
        fields = lines.get(cpu)
        if fields is None or len(fields) < COUNTED_COLUMNS:
            raise ValueError(f"/proc/stat: no full line for cpu{cpu} "
                             f"(needs {COUNTED_COLUMNS} columns: user ... steal)")
        ticks = [int(field) for field in fields[:COUNTED_COLUMNS]]
        total.append(sum(ticks))
        busy.append(total[-1] - sum(ticks[column] for column in IDLE_COLUMNS))
    return tuple(busy), tuple(total)


def own_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (every CPU where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def read_sample(cpus: Sequence[int] | None = None, stat_path: str = "/proc/stat") -> CpuSample | None:
    """A reading of ``cpus`` (default: this process's), or None where /proc/stat is missing."""
    cpus = own_cpus() if cpus is None else cpus
    try:
        with open(stat_path) as stat:
            busy, total = parse_proc_stat(stat.read(), cpus)
    except (OSError, ValueError):
        return None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return CpuSample(busy, total, own_cpu_seconds(), time.monotonic(), load)


def own_cpu_seconds() -> float:
    """This process's CPU time, all its threads, plus that of the engines it runs in processes
    of their own, alive or ended (``benchmarks.engines.isolated.children_cpu_seconds``): the run's own
    work, which the cores' readings must not count as another program's."""
    return time.process_time() + isolated.children_cpu_seconds()


def between(before: CpuSample, after: CpuSample) -> CoreLoad:
    """Others' use of the CPUs from ``before`` to ``after``: each CPU's busy share of its ticks,
    summed, less this process's own CPU time over the wall time (its threads ran there too)."""
    if len(before.busy_ticks) != len(after.busy_ticks):
        raise ValueError(f"samples of {len(before.busy_ticks)} and {len(after.busy_ticks)} CPUs")
    wall = after.wall_s - before.wall_s
    if wall <= 0:
        raise ValueError(f"the second sample must be later than the first (wall {wall} s)")
    busy = sum((b1 - b0) / (t1 - t0) for b0, b1, t0, t1 in zip(
        before.busy_ticks, after.busy_ticks, before.total_ticks, after.total_ticks, strict=True)
        if t1 > t0)
    own = (after.own_cpu_s - before.own_cpu_s) / wall
    return CoreLoad(len(before.busy_ticks), max(0.0, busy - own), wall, after.load)


def look(window_s: float = SAMPLE_SECONDS, *, read: Callable[[], CpuSample | None] = read_sample,
         sleep: Callable[[float], None] = time.sleep) -> CoreLoad | None:
    """Others' use of this process's CPUs over ``window_s`` while this process sleeps, or None
    where the CPUs cannot be read (no /proc/stat)."""
    before = read()
    if before is None:
        return None
    sleep(window_s)
    after = read()
    return between(before, after) if after is not None else None


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def choose_threads(before: CoreLoad | None, requested: int | None, default: int) -> ThreadChoice:
    """The threads to time with: ``requested`` as given (with a warning when it outnumbers the
    free cores), else ``default`` cut to the free cores, at least one. ``before`` None (cores
    not read): the count as asked, and nothing to say."""
    if (requested is not None and requested < 1) or default < 1:
        raise ValueError(f"thread counts must be >= 1, got requested={requested}, default={default}")
    wanted = requested if requested is not None else default
    if before is None:
        return ThreadChoice(wanted, requested, default, None, None, busy=False, contended=False)
    free, cpus = before.free, before.cpus
    busy = free < cpus
    seen = f"{free} of {cpus} cores free ({before.describe()})"
    if requested is not None:
        contended = requested > free
        line = (f"warning: --threads {requested} with {seen}: each operator's parallel region "
                "waits for the thread on a busy core, so times are inflated, rows of many small "
                "operators most" if contended else None)
        return ThreadChoice(requested, requested, default, before, line, busy, contended)
    threads = max(1, min(default, free))
    contended = threads > free  # only when no core at all is free
    if contended:
        line = (f"{plural(threads, 'thread')}: {seen}; the timed work shares its core with others, "
                "so times are inflated")
    elif threads < default:
        line = (f"{plural(threads, 'thread')}, not {default}: {seen}; a parallel region would wait "
                f"on a busy core at every operator (--threads {default} to insist)")
    else:
        line = f"{plural(threads, 'thread')}: {seen}"
    return ThreadChoice(threads, requested, default, before, line, busy, contended)


def settle_threads(requested: int | None, default: int, *,
                   observe: Callable[[], CoreLoad | None] = look) -> ThreadChoice:
    """``choose_threads`` on a fresh look at the cores, unless the run is to use one thread:
    then there is nothing to choose and no other thread to wait for (``during`` still tells,
    across the run, whether others competed for its core)."""
    wanted = requested if requested is not None else default
    return choose_threads(observe() if wanted > 1 else None, requested, default)


def during(before: CpuSample | None, after: CpuSample | None, threads: int) -> dict | None:
    """Others' use of the cores across a run, for the report: the reading and whether the
    run's ``threads`` outnumbered the cores left free; None where the CPUs were not read."""
    if before is None or after is None:
        return None
    load = between(before, after)
    return {"others_during": load.others, "free_during": load.free, "cpus": load.cpus,
            "run_s": load.window_s, "load_after": load.load, "contended_during": threads > load.free}


# --- the OpenMP wait policy ----------------------------------------------------------------

WAIT_POLICIES = ("active", "passive")
# The policy compare.py sets when neither --omp-wait-policy nor OMP_WAIT_POLICY says one; None
# leaves the OpenMP runtime's own (libgomp: spin a while at a barrier, then sleep).
DEFAULT_WAIT_POLICY: str | None = None


class QuietParser(argparse.ArgumentParser):
    """A parser that raises ValueError instead of printing usage and exiting."""

    def error(self, message: str):
        raise ValueError(message)


def wait_policy_problem(option: str | None, environ: Mapping[str, str]) -> str | None:
    """Why ``--omp-wait-policy option`` did not take (the environment torch loaded with says
    otherwise: the option was read after torch loaded), or None."""
    if option and environ.get("OMP_WAIT_POLICY", "").lower() != option:
        return (f"--omp-wait-policy {option}: torch was loaded before the option was read; "
                "run compare.py as a program, or set OMP_WAIT_POLICY")
    return None


def wait_policy_environment(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """What to add to the environment before torch loads OpenMP: ``--omp-wait-policy`` from
    ``argv`` if given, else ``DEFAULT_WAIT_POLICY`` if set and the environment has no
    OMP_WAIT_POLICY; else nothing. A bad value is left for the full parser to refuse."""
    early = QuietParser(add_help=False)
    early.add_argument("--omp-wait-policy")
    try:
        chosen = early.parse_known_args(list(argv))[0].omp_wait_policy
    except ValueError:  # e.g. the option without a value: the full parser says so
        return {}
    if chosen is None and "OMP_WAIT_POLICY" not in environ:
        chosen = DEFAULT_WAIT_POLICY
    if chosen is None or chosen.lower() not in WAIT_POLICIES:
        return {}
    return {"OMP_WAIT_POLICY": chosen.upper()}
