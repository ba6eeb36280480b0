"""Timers: a step's time merged across rounds, and the matmul peak the % columns refer to."""

from __future__ import annotations

import functools
import math
import resource
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.benchmark import Measurement
from torch.utils.benchmark.utils.common import TaskSpec

from benchmarks.compare.measured import Cell

# A step that takes at least this long (seconds a call: one call fills a block) is timed, after
# its first round, without the call not kept, which would double its cells' time. Coming back to
# a row after the other rows' calls, such a step reads its weights from memory either way (the
# small preset's 47 MB are more than the caches): timed right after the other rows and again at
# once, every row's small-preset step differed by under 1% (docs/results/cpu-small-default-cost.md).
# A shorter step is timed in a block of several calls, whose first would pay for the caches.
WARM_CALL_BELOW = 0.05


def time_step(cell: Cell, step: Callable[[], object], *, threads: int, min_run_time: float,
              label: str = "", sub_label: str = "", description: str = "") -> None:
    """One more round of ``step``: one call not kept, then ``cell.number`` calls timed as one
    block (about ``min_run_time`` seconds, at least one call), merged into ``cell`` with its
    calls and minor page faults. The call not kept is the step's first ever in the first round
    (first-call set-up), and sizes the block; after that, it brings a short step's weights back
    into the caches the other rows' calls of the round took over, and steps of at least
    ``WARM_CALL_BELOW``, for which it would pay nothing back, skip it. (``blocked_autorange``
    warms up with its estimate; ``Timer.timeit`` with two calls each time.) ``timeit.Timer``
    with a clock that waits for CUDA is the timer. An exception from the step propagates;
    ``cell`` is then unchanged."""
    calls = 0

    def counted() -> None:
        nonlocal calls
        calls += 1
        step()

    timer = timeit.Timer(counted, timer=synchronized_clock)
    if cell.number is None or cell.seconds < WARM_CALL_BELOW:
        warm = timer.timeit(1)
        calls = 0
        if cell.number is None:
            cell.number = max(1, round(min_run_time / warm)) if warm > 0 else 1
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = timer.timeit(cell.number)
    cell.page_faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    cell.calls += calls
    measurement = Measurement(cell.number, [seconds], TaskSpec(
        "step()", "pass", label=label, sub_label=sub_label, description=description, num_threads=threads))
    cell.rounds.append(measurement.median)
    previous = [cell.measurement] if cell.measurement else []
    cell.measurement = Measurement.merge([*previous, measurement])[0]


def synchronized_clock() -> float:
    """``time.perf_counter()`` once queued CUDA work has finished (as torch's Timer reads it)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


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

    SECONDS_PER_SHAPE = 0.05  # per round (at least one call): the peak takes a fraction of a round

    def __init__(self, device: str, dtype: torch.dtype, threads: int,
                 shapes: list[tuple[int, int, int]]) -> None:
        self.threads = threads
        self.calls: dict[tuple[int, int, int], Callable[[], object]] = {}
        for m, k, n in shapes:
            # x (M, K) times a weight stored (N, K), as nn.Linear and F.linear hold it
            x, weight = (torch.randn(rows, k, device=device).to(dtype) for rows in (m, n))
            self.calls[(m, k, n)] = functools.partial(F.linear, x, weight)
            self.calls[(m, k, n)]()  # warm up (first-call library set-up, kernel selection)
        self.cells = {shape: Cell() for shape in self.calls}  # each shape's rounds, as a row's

    def measure(self) -> None:
        """One more round over every shape: a block of about ``SECONDS_PER_SHAPE`` each."""
        for (m, k, n), call in self.calls.items():
            time_step(self.cells[(m, k, n)], call, threads=self.threads,
                      min_run_time=self.SECONDS_PER_SHAPE, label="matmul peak", sub_label=f"{m}x{k}x{n}")

    def peak(self) -> Peak:
        """The rounds merged per shape; the best shape's rate, spread and rounds."""
        merged = {shape: cell.measurement for shape, cell in self.cells.items()}
        by_shape = {shape: 2 * math.prod(shape) / m.median for shape, m in merged.items()}
        best = max(by_shape, key=by_shape.get)
        flops = 2 * math.prod(best)
        fast, slow = torch.tensor(merged[best].times, dtype=torch.float64).quantile(
            torch.tensor([0.25, 0.75], dtype=torch.float64)).tolist()
        return Peak(by_shape[best], flops / fast - flops / slow,
                    tuple(flops / seconds for seconds in self.cells[best].rounds), best, by_shape)


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
