"""Timers: a step's time merged across rounds, and the matmul peak the % columns refer to."""

from __future__ import annotations

import resource
from collections.abc import Callable

import torch
from torch.utils.benchmark import Measurement, Timer

from benchmarks.measured import Cell


def time_step(cell: Cell, step: Callable[[], object], *, threads: int, min_run_time: float,
              label: str = "", sub_label: str = "", description: str = "") -> None:
    """One more ``blocked_autorange`` of ``step``, merged into ``cell`` with its calls and
    minor page faults. An exception from the step propagates; ``cell`` is then unchanged."""
    calls = 0

    def counted() -> None:
        nonlocal calls
        calls += 1
        step()

    timer = Timer("step()", globals={"step": counted}, num_threads=threads,
                  label=label, sub_label=sub_label, description=description)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    cell.page_faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    cell.calls += calls
    previous = [cell.measurement] if cell.measurement else []
    cell.measurement = Measurement.merge([*previous, measurement])[0]


class MatmulPeak:
    """A large square matmul in the block's dtype, timed beside the rows in every round."""

    def __init__(self, device: str, dtype: torch.dtype, threads: int) -> None:
        n = 8192 if device == "cuda" else 2048
        a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
        self.flops = 2 * n**3
        self.timer = Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads, label="matmul peak")
        self.timer.timeit(1)  # warm up (first-call library set-up)
        self.measurements: list[Measurement] = []

    def measure(self, min_run_time: float) -> None:
        """One more round (at most half a second: the peak is steady)."""
        self.measurements.append(self.timer.blocked_autorange(min_run_time=min(min_run_time, 0.5)))

    def flops_per_second(self) -> float:
        """The rounds merged: FLOP/s at their median."""
        return self.flops / Measurement.merge(self.measurements)[0].median


def float32_matmul_precision(device: str) -> str:
    """What a float32 matmul on ``device`` runs in: "TF32" (CUDA with TF32 allowed, e.g. by
    torch.set_float32_matmul_precision("high")) or "IEEE float32"."""
    if device != "cuda":
        return "IEEE float32"
    matmul = torch.backends.cuda.matmul
    setting = getattr(matmul, "fp32_precision", "none")  # newer torch: "ieee", "tf32" or "none"
    if setting in ("ieee", "tf32"):
        return "TF32" if setting == "tf32" else "IEEE float32"
    return "TF32" if matmul.allow_tf32 else "IEEE float32"  # follows the float32 precision setting
