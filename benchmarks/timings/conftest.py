"""Settings shared by the pytest-benchmark timings (run with ``pytest benchmarks/``)."""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks.compare.machine import CpuSample, ThreadChoice, during, plural, read_sample, settle_threads
from benchmarks.compare.memory import keep_freed_memory


def pytest_configure(config):
    # the same allocator policy as compare.py, so the two report the same kind of numbers
    config.stash[ALLOCATOR] = keep_freed_memory()
    # and the same thread choice: no more threads than free cores, unless OMP_NUM_THREADS says
    requested = torch.get_num_threads() if "OMP_NUM_THREADS" in os.environ else None
    choice = settle_threads(requested, torch.get_num_threads())
    torch.set_num_threads(choice.threads)
    config.stash[THREADS] = choice
    config.stash[STARTED] = read_sample()


def pytest_report_header(config):
    choice = config.stash[THREADS]
    return [f"allocator: {config.stash[ALLOCATOR]}",
            f"torch {torch.__version__}, {choice.threads} CPU threads"
            + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no CUDA"),
            *([f"threads: {choice.line}"] if choice.line else [])]


def pytest_terminal_summary(terminalreporter, config):
    """Whether other processes competed for the cores while the timings ran."""
    if config.option.collectonly:
        return
    threads = config.stash[THREADS].threads
    cores = during(config.stash[STARTED], read_sample(), threads)
    if cores and cores["contended_during"]:
        terminalreporter.write_line(
            f"warning: timed on busy cores: others used {cores['others_during']:.2f} of "
            f"{cores['cpus']} cores during the run, leaving {cores['free_during']} free for "
            f"{plural(threads, 'thread')}; the times are inflated", yellow=True)


ALLOCATOR = pytest.StashKey[str]()
THREADS = pytest.StashKey[ThreadChoice]()  # the threads every timing runs with, and why
STARTED = pytest.StashKey[CpuSample | None]()  # the CPU reading at the start, for the one at the end
