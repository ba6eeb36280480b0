"""Timers: a step's time merged across rounds, and the matmul peak the % columns refer to."""

from __future__ import annotations

import math
import resource
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
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
    cell.rounds.append(measurement.median)
    previous = [cell.measurement] if cell.measurement else []
    cell.measurement = Measurement.merge([*previous, measurement])[0]


@dataclass(frozen=True)
class Peak:
    """The matmul peak of a block: the best GEMM shape's rate at its median over the rounds."""

    flops_per_second: float  # the best shape's FLOP/s at its merged median time
    iqr_flops_per_second: float  # its spread: FLOP/s at the first quartile of time minus at the third
    rounds: tuple[float, ...]  # the best shape's FLOP/s in each round
    shape: tuple[int, int, int]  # the best (M, K, N)
    by_shape: dict[tuple[int, int, int], float]  # every candidate's FLOP/s at its merged median


class MatmulPeak:
    """The matmul peak for the block's dtype: every (M, K, N) in ``shapes`` (the GEMMs the model
    runs, and a large square) timed in every round beside the rows; the best shape wins.

    A single square matmul is not the peak of every dtype: CPU bfloat16 kernels reach very
    different rates at different shapes, so a square alone made "% of peak" swing by 3x between
    runs. The shapes the model runs bound what its steps could reach.
    """

    SECONDS_PER_SHAPE = 0.1  # at most, per round: five shapes cost about what one square did

    def __init__(self, device: str, dtype: torch.dtype, threads: int,
                 shapes: list[tuple[int, int, int]]) -> None:
        self.timers: dict[tuple[int, int, int], Timer] = {}
        for m, k, n in shapes:
            # x (M, K) times a weight stored (N, K), as nn.Linear and F.linear hold it
            x, weight = (torch.randn(rows, k, device=device).to(dtype) for rows in (m, n))
            timer = Timer("linear(x, weight)", globals={"linear": F.linear, "x": x, "weight": weight},
                          num_threads=threads, label="matmul peak", sub_label=f"{m}x{k}x{n}")
            timer.timeit(1)  # warm up (first-call library set-up, kernel selection)
            self.timers[(m, k, n)] = timer
        self.measurements: dict[tuple[int, int, int], list[Measurement]] = {s: [] for s in self.timers}

    def measure(self, min_run_time: float) -> None:
        """One more round over every shape."""
        for shape, timer in self.timers.items():
            run_time = min(min_run_time, self.SECONDS_PER_SHAPE)
            self.measurements[shape].append(timer.blocked_autorange(min_run_time=run_time))

    def peak(self) -> Peak:
        """The rounds merged per shape; the best shape's rate, spread and rounds."""
        merged = {shape: Measurement.merge(rounds)[0] for shape, rounds in self.measurements.items()}
        by_shape = {shape: 2 * math.prod(shape) / m.median for shape, m in merged.items()}
        best = max(by_shape, key=by_shape.get)
        flops = 2 * math.prod(best)
        fast, slow = torch.tensor(merged[best].times, dtype=torch.float64).quantile(
            torch.tensor([0.25, 0.75], dtype=torch.float64)).tolist()
        return Peak(by_shape[best], flops / fast - flops / slow,
                    tuple(flops / m.median for m in self.measurements[best]), best, by_shape)


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
