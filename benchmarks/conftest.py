"""Settings shared by the pytest-benchmark timings (run with ``pytest benchmarks/``)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.memory import keep_freed_memory


def pytest_configure(config):
    # the same allocator policy as compare.py, so the two report the same kind of numbers
    config.stash[ALLOCATOR] = keep_freed_memory()


def pytest_report_header(config):
    return [f"allocator: {config.stash[ALLOCATOR]}",
            f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads"
            + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no CUDA")]


ALLOCATOR = pytest.StashKey[str]()
