"""What a block measures: a ``Cell`` per (variant, mode), a ``Row`` per variant."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn
from torch.utils.benchmark import Measurement


@dataclass
class Cell:
    """What one (variant, mode) measured, or why it could not."""

    measurement: Measurement | None = None  # the rounds merged so far
    rounds: list[float] = field(default_factory=list)  # each round's seconds per call, in order
    number: int | None = None  # calls timed as one block each round, found in the first
    error: str | None = None  # "OOM" or a short description; the cell is then skipped
    calls: int = 0  # step calls timed, to average the page faults over
    page_faults: int = 0  # minor page faults while timing

    @property
    def seconds(self) -> float | None:
        """The median time of one step, once measured."""
        return self.measurement.median if self.measurement else None


@dataclass
class Row:
    """One variant (or deployment engine) in one block: its model, its steps and what they measured."""

    variant: str  # the variant, or an engine row's label ("ctranslate2 int8")
    model: nn.Module | None  # None for an engine row (benchmarks.engines.rows): decode cells only
    cells: dict[str, Cell] = field(default_factory=dict)  # mode -> what it measured
    steps: dict[str, Callable[[], object]] = field(default_factory=dict)  # mode -> the timed call
    compile_s: float | None = None  # warm-up time of the compiled steps
    max_abs_dlogp: float | None = None  # largest |log-prob difference| from the reference
    dlogp_error: str | None = None  # why the eval forward for the log-prob check failed
    peak_mb: dict[str, float] = field(default_factory=dict)  # mode -> weights + step's peak
    fast_path: bool = False  # whether the forward ran nn.Transformer's fused eval kernels
    sdpa_backends: dict[str, str | None] = field(default_factory=dict)  # mode -> SDPA kernels run
    decode_positions: dict[str, int] = field(default_factory=dict)  # decode mode -> the target
    # ids one call produces (BOS excluded)
    cache_bytes: tuple[float, float] | None = None  # key/value cache per source: (cross-attention,
    # growth per decoded token); None without a cache
