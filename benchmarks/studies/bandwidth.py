"""The machine's limit for a cached decoding step: streaming read bandwidth, and the weight bytes
one step must read.

    bandwidth = read_bandwidth(BandwidthSettings(threads=2))    # bytes/s of a plain sum
    weights = step_weight_bytes(model.config, torch.float32, batch=8)
    bound_s = weights.total / bandwidth.bytes_per_second      # no cached step can be faster

A cached step at batch B multiplies one row per sequence by every weight matrix of the decoder
and by the generator: at a small batch that is a matrix-vector product, which reads each weight
once and does two FLOPs per weight and row, so the machine's memory bandwidth, not its
arithmetic, sets its pace. ``read_bandwidth`` measures that pace as the machine streams a buffer
well above its last-level cache through ``torch.sum`` (one read, almost no arithmetic), and
``step_weight_bytes`` counts what a step reads; their quotient is the time a step would take
if it did nothing but stream its weights once.

Counted per step (canonical names, docs/architecture.md): every decoder layer's self-attention Q, K, V and
output projections, cross-attention Q and output projections, feed-forward and norms, the final
decoder norm, the generator's weight and bias, and B rows of the target embedding (the gathers).
Not counted: the cross-attention K and V projections (run once per source, by ``start_cache``),
the sinusoid row (D float64 numbers), and the cache's keys and values, activations that grow
with the position (2·B·D·(t + S) numbers per layer): so the bound is a floor, not an estimate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.benchmark import Measurement, Timer

from common.config import TransformerConfig
from common.weights import canonical_shapes

MIN_BUFFER_BYTES = 256 * 2**20  # at least this much, whatever the cache size read says
CACHE_MULTIPLE = 4  # the buffer is this many times the last-level cache: a cached share is small


@dataclass(frozen=True)
class BandwidthSettings:
    """How to measure read bandwidth."""

    threads: int = 1  # torch threads for the sum, as for the steps it is compared with
    buffer_bytes: int | None = None  # the buffer summed; None: CACHE_MULTIPLE x the last-level cache
    min_run_time: float = 0.5  # seconds of repeated sums per measurement
    device: str = "cpu"  # where the buffer lives (cuda: device memory bandwidth)

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.buffer_bytes is not None and self.buffer_bytes < 4:
            raise ValueError(f"buffer_bytes must hold one float32 (4 bytes) or more, got {self.buffer_bytes}")
        if not self.min_run_time > 0:
            raise ValueError(f"min_run_time must be > 0 seconds, got {self.min_run_time}")


@dataclass(frozen=True)
class Bandwidth:
    """A measured streaming read rate."""

    bytes_per_second: float  # buffer bytes / median time of one sum
    buffer_bytes: int  # the bytes one sum reads
    threads: int
    measurement: Measurement  # every timed block, for the spread


def last_level_cache_bytes(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache of CPU 0 in bytes (Linux sysfs), or None where it cannot be read."""
    sizes = []
    for size_file in cpu.glob("index*/size"):
        text = size_file.read_text().strip().upper()  # e.g. "32768K"
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=None)


def default_buffer_bytes() -> int:
    cache = last_level_cache_bytes() if os.name == "posix" else None
    return max(MIN_BUFFER_BYTES, CACHE_MULTIPLE * (cache or 0))


def read_bandwidth(settings: BandwidthSettings = BandwidthSettings()) -> Bandwidth:
    """Bytes per second that ``torch.sum`` streams over a float32 buffer (median of the blocks
    ``blocked_autorange`` times, after one warm-up sum that faults the pages in)."""
    buffer_bytes = settings.buffer_bytes or default_buffer_bytes()
    buffer = torch.ones(buffer_bytes // 4, dtype=torch.float32, device=settings.device)
    timer = Timer("buffer.sum()", globals={"buffer": buffer}, num_threads=settings.threads,
                  label="read bandwidth", sub_label=f"{buffer.nbytes / 2**20:.0f} MiB")
    timer.timeit(1)
    measurement = timer.blocked_autorange(min_run_time=settings.min_run_time)
    return Bandwidth(buffer.nbytes / measurement.median, buffer.nbytes, settings.threads, measurement)


@dataclass(frozen=True)
class StepBytes:
    """Weight bytes one cached decode step reads, by where they are read."""

    decoder: int  # every decoder layer's weights but the cross-attention K/V projections, final norm
    generator: int  # the (V, D) weight and the (V,) bias
    embedding_rows: int  # B rows of D of the target embedding

    @property
    def total(self) -> int:
        return self.decoder + self.generator + self.embedding_rows


def step_weight_bytes(config: TransformerConfig, dtype: torch.dtype, batch: int) -> StepBytes:
    """What one cached step at batch ``batch`` reads of a model's weights in ``dtype`` (the
    module docstring says what is counted and what is not)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    size = torch.empty((), dtype=dtype).element_size()
    numbers = {name: torch.Size(shape).numel() for name, shape in canonical_shapes(config).items()}
    once_per_source = (".cross_attn.wk.", ".cross_attn.wv.")  # projected by start_cache
    decoder = sum(n for name, n in numbers.items()
                  if name.startswith("decoder.") and not any(part in name for part in once_per_source))
    generator = numbers["generator.weight"] + numbers["generator.bias"]
    return StepBytes(decoder * size, generator * size, batch * config.d_model * size)
