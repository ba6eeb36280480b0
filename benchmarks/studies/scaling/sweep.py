"""The scaling study's measurements: every row's forward and train step at growing lengths (two
sweeps: a fixed number of tokens per batch, and a fixed batch), the attention core alone at the
same shapes, and greedy decoding's time per token against the tokens already in the cache.

    result = measure(ScalingSettings(config, lengths=(32, 64), tokens=128, batch=2, ...))

Timing is compare.py's (``benchmarks.compare``): each cell a block of calls of about
``min_run_time`` seconds per round (``time_step``), every round the cells in a fresh shuffled
order (``each_round_order``), the median over rounds reported and every round kept for the fits;
peak memory from ``profile_step`` after the timing, from a state without gradients. A cached
decode step changes its cache, so it cannot be repeated: each is timed once per round, and a
length's time is the mean of the steps in its octave (L/2, L].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from statistics import median

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.compare.failures import is_out_of_memory
from benchmarks.compare.measured import Cell
from benchmarks.compare.memory import model_bytes, profile_step
from benchmarks.compare.ratios import each_round_order
from benchmarks.compare.steps import forward_backward, forward_step
from benchmarks.compare.timing import synchronized_clock, time_step
from benchmarks.studies.scaling.analysis import predicted_peak
from common.config import TransformerConfig
from common.masks import mask_scores
from common.random_batch import random_batch
from common.weights import transfer
from seq2seq.search.strategy import NextToken
from variants import REFERENCE, build

PHASES = ("forward", "train")
SWEEPS = ("tokens", "batch")  # a fixed number of tokens per batch; a fixed batch
# which attention core a row's step runs: SDPA (fused, and torch's multi-head attention, which
# calls it), or scores, mask, softmax, dropout and weights x values written out (the teaching rows)
CORES = {"fused": "sdpa", "torch": "sdpa"}
MATERIALISED = "materialised"


@dataclass(frozen=True)
class ScalingSettings:
    """What the study measures and how."""

    config: TransformerConfig  # the model; max_seq_len covers the longest length
    variants: tuple[str, ...]  # the rows, each built through variants.build from one seed
    lengths: tuple[int, ...]  # S: the source and the target length of each step
    tokens: int  # the fixed-tokens sweep's tokens per batch: batch = tokens // S
    batch: int  # the fixed-batch sweep's batch
    decode_lengths: tuple[int, ...]  # L: tokens in the cache at which decoding is reported
    decode_batch: int  # sources decoded at once
    decode_src: int  # their length
    rounds: int  # rounds of every cell
    min_run_time: float  # seconds of each cell's block of calls per round
    threads: int  # torch's CPU threads
    seed: int  # weights, batches and round orders
    memory_limit: float  # bytes: a step whose predicted peak passes it is not run

    def batch_at(self, sweep: str, length: int) -> int:
        """The batch of ``sweep`` at ``length`` (0: none fits)."""
        return self.tokens // length if sweep == "tokens" else self.batch


def build_rows(settings: ScalingSettings) -> dict[str, torch.nn.Module]:
    """Every row from the reference's weights (seed ``settings.seed``), transferred."""
    reference = build(REFERENCE, settings.config, seed=settings.seed)
    rows = {}
    for name in settings.variants:
        model = reference if name == REFERENCE else build(name, settings.config)
        if model is not reference:
            transfer(reference, model)
        rows[name] = model
    return rows


def core_kind(row: str) -> str:
    return CORES.get(row, MATERIALISED)


def attention_core(kind: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout: float) -> Tensor:
    """One attention's core at (B, H, S, Dh): SDPA, or written out as the teaching rows write it."""
    if kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, S, S)
    weights = mask_scores(scores, mask).softmax(dim=-1)  # (B, H, S, S)
    return F.dropout(weights, dropout, training=dropout > 0) @ v  # (B, H, S, Dh)


def core_step(config: TransformerConfig, kind: str, phase: str, batch: int, length: int,
              generator: torch.Generator) -> Callable[[], object]:
    """A call of one attention core at the step's shapes: under no_grad for the forward; with
    dropout and a backward into q, k and v for training."""
    shape = (batch, config.n_heads, length, config.d_model // config.n_heads)
    q, k, v = (torch.randn(shape, generator=generator) for _ in range(3))
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)  # (B, 1, 1, S): padding, none padded
    if phase == "forward":
        def forward() -> Tensor:
            with torch.no_grad():
                return attention_core(kind, q, k, v, mask, 0.0)
        return forward
    for t in (q, k, v):
        t.requires_grad_(True)

    def train() -> None:
        attention_core(kind, q, k, v, mask, config.dropout).sum().backward()
        for t in (q, k, v):
            t.grad = None
    return train


@dataclass
class SizeResult:
    """One sweep at one length: every (row, phase) cell and every (core, phase) cell."""

    sweep: str
    length: int
    batch: int
    cells: dict[str, Cell]  # "row/phase" and "core:kind/phase" -> its rounds
    peaks: dict[str, int]  # "row/phase" -> measured bytes: the model's own plus the step's peak
    skipped: dict[str, str]  # "row/phase" -> why it did not run

    def as_dict(self, settings: ScalingSettings) -> dict:
        cells = {}
        for key, cell in self.cells.items():
            name, phase = key.split("/")
            entry = {"rounds_s": cell.rounds, "median_s": median(cell.rounds) if cell.rounds else None,
                     "error": cell.error}
            if not name.startswith("core:"):
                entry["peak_bytes"] = self.peaks.get(key)
                entry["predicted"] = predicted_peak(settings.config, name, phase, self.batch,
                                                    self.length).as_dict()
            cells[key] = entry
        return {"sweep": self.sweep, "length": self.length, "batch": self.batch, "cells": cells,
                "skipped": self.skipped}


def plan(settings: ScalingSettings) -> Iterator[tuple[str, int, int]]:
    """(sweep, length, batch) of every size the sweeps run, in order."""
    for sweep in SWEEPS:
        for length in settings.lengths:
            batch = settings.batch_at(sweep, length)
            if batch >= 1:
                yield sweep, length, batch


def measure_size(settings: ScalingSettings, rows: dict[str, torch.nn.Module], sweep: str, length: int,
                 batch: int, tick: Callable[[str], None]) -> SizeResult:
    """Time every row and core at one size in interleaved rounds, then each row's peak memory."""
    data = random_batch(settings.config, batch, length, length, seed=settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    steps, skipped = {}, {}
    for name, model in rows.items():
        for phase in PHASES:
            predicted = predicted_peak(settings.config, name, phase, batch, length).total
            if predicted > settings.memory_limit:
                skipped[f"{name}/{phase}"] = f"predicted {predicted / 2**30:.1f} GiB over the limit"
                continue
            make = forward_backward if phase == "train" else forward_step
            steps[f"{name}/{phase}"] = (model, phase, make(model, data))
    for kind in sorted({core_kind(name) for name in rows}):
        for phase in PHASES:
            steps[f"core:{kind}/{phase}"] = (None, phase, core_step(settings.config, kind, phase, batch,
                                                                   length, generator))
    cells = {key: Cell() for key in steps}
    for index, order in enumerate(each_round_order(list(steps), settings.rounds, settings.seed + length)):
        tick(f"{sweep} S={length} B={batch} round {index + 1}/{settings.rounds}")
        for key in order:
            model, phase, step = steps[key]
            if cells[key].error:
                continue
            if model is not None:
                model.train(phase == "train")
            try:
                time_step(cells[key], step, threads=settings.threads, min_run_time=settings.min_run_time,
                          label=f"{sweep} S={length}", sub_label=phase, description=key)
            except (RuntimeError, MemoryError) as error:
                if not is_out_of_memory(error):
                    raise
                cells[key].error = "OOM"
    peaks = {}
    for key, (model, phase, step) in steps.items():
        if model is None or cells[key].error:
            continue
        model.zero_grad(set_to_none=True)
        model.train(phase == "train")
        peaks[key] = model_bytes(model) + profile_step("cpu", step)[0]
        model.zero_grad(set_to_none=True)
    return SizeResult(sweep, length, batch, cells, peaks, skipped)


def decode_scan(settings: ScalingSettings, rows: dict[str, torch.nn.Module],
                tick: Callable[[str], None]) -> dict[str, dict[str, dict[int, list[float]]]]:
    """Seconds per decoded token at each of ``settings.decode_lengths`` (L: tokens in the cache
    when the step runs), each round: {row: {"cached": {L: [per round]}, "recompute": {...}}}.
    Cached: every step from the first to the longest L timed once (it grows the cache), a
    length's value the mean of the steps in (L/2, L]; torch has no cache and gets none.
    Recompute: the whole prefix of L tokens decoded again, a block of calls (``time_step``).
    The tokens are the batch's target ids, forced: the same prefix for every row."""
    longest = max(settings.decode_lengths)
    data = random_batch(settings.config, settings.decode_batch, settings.decode_src, longest + 1,
                        seed=settings.seed)
    tokens = data.tgt  # (B, longest + 1)
    found = {name: {"cached": {n: [] for n in settings.decode_lengths},
                    "recompute": {n: [] for n in settings.decode_lengths}} for name in rows}
    for index, order in enumerate(each_round_order(list(rows), settings.rounds, settings.seed)):
        tick(f"decode round {index + 1}/{settings.rounds}")
        for name in order:
            model = rows[name].eval()
            with torch.no_grad():
                if getattr(model, "has_cache", False):
                    step = NextToken(model, data.src, data.src_mask, use_cache=True)
                    seconds = []
                    for length in range(1, longest + 1):
                        started = synchronized_clock()
                        step(tokens[:, :length])
                        seconds.append(synchronized_clock() - started)
                    for n in settings.decode_lengths:  # the step at cache length L is seconds[L - 1]
                        window = seconds[n // 2: n]
                        found[name]["cached"][n].append(sum(window) / len(window) / settings.decode_batch)
                recompute = NextToken(model, data.src, data.src_mask, use_cache=False)
                for n in settings.decode_lengths:
                    cell = Cell()
                    prefix = tokens[:, :n]
                    time_step(cell, partial(recompute, prefix), threads=settings.threads,
                              min_run_time=settings.min_run_time)
                    found[name]["recompute"][n].append(cell.rounds[-1] / settings.decode_batch)
    return found
