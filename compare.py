"""``python compare.py``: every variant side by side on the same work, in one run.

For each block (device x dtype x shape) it prints one table with a row per variant in
``variants.VARIANTS``: parameters, forward and train-step time (median and IQR from
``torch.utils.benchmark``), tokens/s, achieved GFLOP/s and % of the matmul peak measured in
the same run, peak memory, time relative to the ``torch`` row, the largest log-probability
difference from ``torch`` after weight transfer, and greedy-decoding throughput.

    python compare.py                                   # small preset, CPU, float32 (< 60 s)
    python compare.py --preset base --batch 8 2 --src-len 128 512
    python compare.py --dtype float32 bfloat16 --format json --output run.json

Method (the README's "compare.py and benchmarks" section has the full story):
- one analytic FLOP count for every row (``forward_flops``; a train step counts 3x forward);
- the variants are interleaved, ``--rounds`` times, so drift hits every row alike, and the
  rounds are merged into one measurement per cell;
- the thread count is fixed (``--threads``) and printed; CUDA is synchronised by the Timer;
- peak memory: CUDA ``max_memory_allocated`` over the step; CPU the peak of the bytes the
  step allocates (``torch.profiler`` memory events, in time order); both plus the model's own
  parameters and buffers;
- glibc is told to keep freed memory for reuse (``keep_freed_memory``), because returning
  large buffers to the OS makes every step page-fault them back in (``--malloc default``
  keeps glibc's behaviour).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import json
import math
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tabulate import tabulate, tabulate_formats
from torch import Tensor, nn
from torch.utils.benchmark import Measurement, Timer

from common.config import TransformerConfig
from seq2seq.decoding import greedy_decode
from common.masks import decoder_mask, padding_mask
from common.weights import transfer
from variants import VARIANTS, build

REFERENCE = "torch"

# name -> (config fields, default batch, default length); base is the paper's base model
PRESETS: dict[str, tuple[dict, int, int]] = {
    "tiny": (dict(d_model=64, n_heads=4, n_layers=2, d_ff=256, src_vocab_size=1000,
                  tgt_vocab_size=1000, max_seq_len=128), 4, 16),
    "small": (dict(d_model=256, n_heads=8, n_layers=3, d_ff=1024, src_vocab_size=8000,
                   tgt_vocab_size=8000, max_seq_len=256), 8, 64),
    "base": (dict(), 8, 128),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FORMATS = (*tabulate_formats, "json", "csv")
BOS_ID = 1  # pad is 0 in every preset; EOS is the last target id


# --- what is measured ----------------------------------------------------------------------


def forward_flops(config: TransformerConfig, batch: int, src_len: int, tgt_len: int) -> int:
    """Matrix-multiply FLOPs of one forward pass (2 per multiply-add), the same for every row.

    Per layer, with S source and T target positions, D = d_model, F = d_ff, V = tgt vocab:
      encoder:  8SD^2 (Q, K, V, O) + 4S^2 D (QK^T, AV) + 4SDF (FFN)
      decoder:  8TD^2 + 4T^2 D (self)  +  4TD^2 + 4SD^2 + 4TSD (cross)  +  4TDF (FFN)
      generator: 2TDV once.
    Causal attention is counted in full (every variant computes the whole T x T matrix);
    softmax, LayerNorm, dropout and embeddings are not counted. A train step is 3x this.
    """
    c = config
    d, f, n = c.d_model, c.d_ff, c.n_layers
    s, t = src_len, tgt_len
    encoder = 8 * s * d * d + 4 * s * s * d + 4 * s * d * f
    decoder = (8 * t * d * d + 4 * t * t * d) + (4 * t * d * d + 4 * s * d * d + 4 * t * s * d) \
        + 4 * t * d * f
    return batch * (n * (encoder + decoder) + 2 * t * d * c.tgt_vocab_size)


@dataclass
class Batch:
    """One padded batch: the ids, the suite's masks and next-token labels."""

    src: Tensor  # (B, S)
    tgt: Tensor  # (B, T)
    labels: Tensor  # (B, T), pad where tgt is pad
    src_mask: Tensor  # (B, 1, 1, S)
    tgt_mask: Tensor  # (B, 1, T, T)


def make_batch(config: TransformerConfig, batch: int, src_len: int, tgt_len: int,
               device: torch.device | str = "cpu", seed: int = 0) -> Batch:
    """Random ids with trailing padding: row 0 is full, the others keep 75-100% of their length.

    No row is all padding and every target starts with a real token, so no attention row is
    fully masked and every variant is compared with the reference at every position.
    """
    generator = torch.Generator().manual_seed(seed)
    pad = config.pad_id

    def ids(vocab_size: int, length: int) -> Tensor:
        tokens = torch.randint(1, vocab_size, (batch, length), generator=generator)
        keep = torch.randint(math.ceil(0.75 * length), length + 1, (batch,), generator=generator)
        keep[0] = length
        return tokens.masked_fill(torch.arange(length) >= keep[:, None], pad)

    src = ids(config.src_vocab_size, src_len).to(device)
    tgt = ids(config.tgt_vocab_size, tgt_len).to(device)
    labels = torch.randint(1, config.tgt_vocab_size, tgt.shape, generator=generator).to(device)
    labels = labels.masked_fill(tgt == pad, pad)
    return Batch(src, tgt, labels, padding_mask(src, pad), decoder_mask(tgt, pad))


def precision(device: str, dtype: torch.dtype, autocast: bool) -> contextlib.AbstractContextManager:
    """The autocast region for ``--autocast``; otherwise nothing (the model itself is cast)."""
    if autocast and dtype != torch.float32:
        return torch.autocast(device, dtype=dtype)
    return contextlib.nullcontext()


def forward_step(model: nn.Module, batch: Batch, autocast: Callable[[], contextlib.AbstractContextManager]
                 ) -> Callable[[], Tensor]:
    """Inference: eval-mode log-probs under no_grad (the caller puts the model in eval mode)."""

    def step() -> Tensor:
        with torch.no_grad(), autocast():
            return model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)

    return step


def train_step(model: nn.Module, batch: Batch, autocast: Callable[[], contextlib.AbstractContextManager]
               ) -> Callable[[], None]:
    """Training without the optimiser: forward, token-level NLL, backward into fresh grads."""
    pad_id = model.config.pad_id

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast():
            logp = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)  # (B, T, V)
            loss = F.nll_loss(logp.flatten(0, 1).float(), batch.labels.flatten(), ignore_index=pad_id)
        loss.backward()

    return step


def decode_step(model: nn.Module, batch: Batch, max_len: int,
                autocast: Callable[[], contextlib.AbstractContextManager]) -> Callable[[], Tensor]:
    """Greedy decoding of the batch's sources (``seq2seq.decoding.greedy_decode``)."""
    eos_id = model.config.tgt_vocab_size - 1

    def step() -> Tensor:
        with autocast():
            return greedy_decode(model, batch.src, batch.src_mask, max_len=max_len,
                                 bos_id=BOS_ID, eos_id=eos_id)

    return step


def keep_freed_memory() -> str:
    """Make glibc keep freed memory for reuse instead of handing large buffers back to the OS.

    By default glibc serves big allocations with mmap and unmaps them on free, so every step
    of a model whose activations are megabytes page-faults all of them in again (3-18% of a
    CPU train step here). With mmap off (M_MMAP_MAX=0) and a 2 GiB trim threshold, freed
    activations stay in the heap and the next step reuses them; the price is a process that
    holds on to its high-water mark. Returns a description for the header.
    """
    if platform.libc_ver()[0] != "glibc":
        return "system malloc, untouched (not glibc)"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    m_trim_threshold, m_mmap_max = -1, -4  # from <malloc.h>
    if libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1):
        return "glibc keeps freed memory (mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB)"
    return "glibc default (mallopt refused)"


def matmul_peak_timer(device: str, dtype: torch.dtype, threads: int) -> tuple[Timer, int]:
    """A large square matmul in ``dtype`` and its FLOPs: the ceiling the % columns refer to."""
    n = 8192 if device == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    timer = Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads, label="matmul peak")
    timer.timeit(1)  # warm up (first-call library set-up)
    return timer, 2 * n**3


def profile_step(device: str, step: Callable[[], object]) -> tuple[int, set[str]]:
    """The most memory ``step`` allocates at once above what was live before it, and its ops.

    CUDA: the caching allocator's own peak counter. CPU, which has none: the profiler's
    memory events (each op's own allocations and frees), summed in time order.
    """
    if device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with quiet_stderr(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                profile_memory=device == "cpu") as profiler:
        step()
    events = profiler.events()
    if device == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start, {event.name for event in events}
    current = peak = 0
    for event in sorted(events, key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak, {event.name for event in events}


@contextlib.contextmanager
def quiet_stderr():
    """Silence the profiler's start/stop chatter, which its C++ side writes straight to fd 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


# the fused kernels of nn.Transformer's eval fast path: seeing them means the path was taken
TORCH_FAST_PATH_OPS = {"aten::_transformer_encoder_layer_fwd", "aten::_native_multi_head_attention"}


def model_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def is_out_of_memory(error: BaseException) -> bool:
    message = str(error).lower()
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError)
        and ("out of memory" in message or "can't allocate memory" in message))


# --- one block: a device, a dtype, a shape; a row per variant -------------------------------


@dataclass
class Cell:
    """What one (variant, mode) measured, or why it could not."""

    measurement: Measurement | None = None
    error: str | None = None  # "OOM" or a short description
    calls: int = 0
    page_faults: int = 0


@dataclass
class Row:
    variant: str
    model: nn.Module
    cells: dict[str, Cell] = field(default_factory=dict)
    steps: dict[str, Callable[[], object]] = field(default_factory=dict)
    compile_s: float | None = None
    max_abs_dlogp: float | None = None
    dlogp_error: str | None = None  # why the eval forward for the log-prob check failed
    peak_mb: dict[str, float] = field(default_factory=dict)
    fast_path: bool = False
    decode_positions: int = 0


class Progress:
    """Elapsed-time progress lines on stderr, so a long run shows where it is."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.start = quiet, time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.start:6.1f} s] {message}", file=sys.stderr, flush=True)


def run_block(args: argparse.Namespace, device: str, dtype_name: str, shape: tuple[int, int, int],
              progress: Progress) -> dict:
    batch_size, src_len, tgt_len = shape
    dtype = DTYPES[dtype_name]
    config = preset_config(args)
    batch = make_batch(config, batch_size, src_len, tgt_len, device, seed=args.seed)
    autocast = functools.partial(precision, device, dtype, args.autocast)
    where = f"{device} {dtype_name} B={batch_size} S={src_len} T={tgt_len}"

    reference = build(REFERENCE, config, seed=args.seed)
    rows = []
    for name in (*args.variants, *([REFERENCE] if REFERENCE not in args.variants else [])):
        model = reference if name == REFERENCE else build(name, config)
        if model is not reference:
            transfer(reference, model)
        model.to(device=device, dtype=torch.float32 if args.autocast else dtype)
        rows.append(Row(name, model))
    timed = [row for row in rows if row.variant in args.variants]

    # correctness next to speed: eval log-probs of every row against the reference's
    progress(f"{where}: log-probs against {REFERENCE}")
    logps = {}
    for row in rows:
        row.model.eval()
        try:
            logps[row.variant] = forward_step(row.model, batch, autocast)().float()
        except Exception as error:  # reported in the row; the run goes on
            row.dlogp_error = describe(error)
            release(row.model, device)
    for row in timed:
        if row.variant in logps and REFERENCE in logps:
            row.max_abs_dlogp = (logps[row.variant] - logps[REFERENCE]).abs().max().item()
    reference_logp = logps.get(REFERENCE)  # with --compile, the compiled forwards are checked too
    del logps

    modes = ["forward", "train"] + (["decode"] if args.decode_len > 1 else [])
    if args.compile:  # the eager steps too, timed in the same rounds: the speed-up columns
        modes += ["forward_eager", "train_eager"]
    for row in timed:
        model = compiled(row.model, args.freeze) if args.compile else row.model
        row.steps = {"forward": forward_step(model, batch, autocast),
                     "train": train_step(model, batch, autocast),
                     "decode": decode_step(row.model, batch, args.decode_len, autocast)}
        if args.compile:
            row.steps["forward_eager"] = forward_step(row.model, batch, autocast)
            row.steps["train_eager"] = train_step(row.model, batch, autocast)
        progress(f"{where}: {row.variant}: " + ("compiling and warming up" if args.compile else "warming up"))
        started = time.perf_counter()
        for mode in modes:  # warm-up call; with --compile, this is where compiling happens
            row.model.train(is_training(mode))
            try:
                result = row.steps[mode]()
                if mode == "decode":
                    row.decode_positions = result.shape[0] * (result.shape[1] - 1)
                if args.compile and mode == "forward" and reference_logp is not None:
                    row.max_abs_dlogp = (result.float() - reference_logp).abs().max().item()
                row.cells[mode] = Cell()
            except Exception as error:
                row.cells[mode] = Cell(error=describe(error))
                release(row.model, device)
            if mode == "train" and device == "cuda":
                torch.cuda.synchronize()
            if args.compile and mode == "train":
                row.compile_s = time.perf_counter() - started

    # the matmul peak is measured in every round too, so it sees the same drift as the rows
    peak_timer, peak_flop_count = matmul_peak_timer(device, dtype, args.threads)
    peak_measurements = []
    for round_index in range(args.rounds):
        peak_measurements.append(peak_timer.blocked_autorange(min_run_time=min(args.min_run_time, 0.5)))
        for mode in modes:
            progress(f"{where}: {mode.replace('_', ' ')}, round {round_index + 1}/{args.rounds}")
            for row in timed:
                measure(row, mode, args, device, where)

    progress(f"{where}: peak memory")
    for row in timed:
        for mode in ("forward", "train"):
            if row.cells[mode].error:
                continue
            row.model.train(mode == "train")
            try:
                peak, ops = profile_step(device, row.steps[mode])
            except Exception as error:
                row.cells[mode].error = describe(error)
                release(row.model, device)
                continue
            row.peak_mb[mode] = (model_bytes(row.model) + peak) / 2**20
            if mode == "forward":
                row.fast_path = bool(ops & TORCH_FAST_PATH_OPS)
        row.model.zero_grad(set_to_none=True)

    peak_flops = peak_flop_count / Measurement.merge(peak_measurements)[0].median
    del reference_logp
    results = [row_result(row, modes, config, shape, peak_flops, rows) for row in timed]
    for row in rows:  # free this block's models before the next block
        row.model.to("cpu")
    release(None, device)
    return {"device": device, "dtype": dtype_name, "batch": batch_size, "src_len": src_len,
            "tgt_len": tgt_len, "matmul_peak_gflops": peak_flops / 1e9, "rows": results}


def compiled(model: nn.Module, freeze: bool) -> nn.Module:
    """``torch.compile(model)``; ``freeze`` adds inductor freezing, which only inference graphs
    use: the weights are folded in as constants (on CPU prepacked for oneDNN's GEMMs), so the
    compiled eval forward must not outlive a change to them. compare.py never changes them."""
    return torch.compile(model, options={"freezing": True} if freeze else None)


def is_training(mode: str) -> bool:
    return mode.startswith("train")


def measure(row: Row, mode: str, args: argparse.Namespace, device: str, where: str) -> None:
    """One more blocked_autorange of ``row``'s ``mode`` step, merged into what it has."""
    cell = row.cells[mode]
    if cell.error:
        return
    row.model.train(is_training(mode))
    step = row.steps[mode]

    def counted() -> None:
        cell.calls += 1
        step()

    timer = Timer("step()", globals={"step": counted}, num_threads=args.threads,
                  label=where, sub_label=mode, description=row.variant)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    try:
        measurement = timer.blocked_autorange(min_run_time=args.min_run_time)
    except Exception as error:
        cell.error = describe(error)
        release(row.model, device)
        return
    cell.page_faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    previous = [cell.measurement] if cell.measurement else []
    cell.measurement = Measurement.merge([*previous, measurement])[0]


def row_result(row: Row, modes: list[str], config: TransformerConfig, shape: tuple[int, int, int],
               peak_flops: float, rows: list[Row]) -> dict:
    batch_size, src_len, tgt_len = shape
    flops = {"forward": forward_flops(config, *shape)}
    flops["train"] = 3 * flops["forward"]
    reference = next(r for r in rows if r.variant == REFERENCE)
    result: dict = {"variant": row.variant,
                    "params": sum(p.numel() for p in row.model.parameters())}
    for mode in (m for m in modes if not m.endswith("_eager")):
        cell = row.cells[mode]
        result[f"{mode}_error"] = cell.error
        seconds = cell.measurement.median if cell.measurement else None
        iqr = cell.measurement.iqr if cell.measurement else None
        if mode == "decode":
            result["decode_tokens_per_s"] = row.decode_positions / seconds if seconds else None
            continue
        result[f"{mode}_ms"] = seconds * 1e3 if seconds else None
        result[f"{mode}_iqr_ms"] = iqr * 1e3 if seconds else None
        result[f"{mode}_gflops"] = flops[mode] / seconds / 1e9 if seconds else None
        result[f"{mode}_pct_peak"] = 100 * flops[mode] / seconds / peak_flops if seconds else None
        result[f"{mode}_peak_mb"] = row.peak_mb.get(mode)
        ref_cell = reference.cells.get(mode)
        ref_seconds = ref_cell.measurement.median if ref_cell and ref_cell.measurement else None
        result[f"{mode}_vs_torch"] = seconds / ref_seconds if seconds and ref_seconds else None
        if mode == "train":
            result["train_tokens_per_s"] = batch_size * (src_len + tgt_len) / seconds if seconds else None
            result["train_page_faults_per_step"] = cell.page_faults / cell.calls if cell.calls else None
    for mode in ("forward", "train"):  # with --compile: eager time / compiled time
        eager, fast = row.cells.get(f"{mode}_eager"), row.cells[mode]
        if eager and eager.measurement and fast.measurement:
            result[f"{mode}_compile_speedup"] = eager.measurement.median / fast.measurement.median
    result["max_abs_dlogp"] = row.max_abs_dlogp
    result["dlogp_error"] = row.dlogp_error
    result["compile_s"] = row.compile_s
    result["torch_fast_path"] = row.fast_path
    return result


def describe(error: BaseException) -> str:
    if is_out_of_memory(error):
        return "OOM"
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line[:160]}"


def release(model: nn.Module | None, device: str) -> None:
    """After a failure (an OOM above all), drop gradients and cached blocks so the rest runs."""
    if model is not None:
        model.zero_grad(set_to_none=True)
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# --- the table ---------------------------------------------------------------------------------

COLUMNS = [  # (title, key, format)
    ("variant", "variant", "{}"),
    ("params M", "params", lambda v: f"{v / 1e6:.2f}"),
    ("fwd ms (IQR)", "forward_ms", None),
    ("train ms (IQR)", "train_ms", None),
    ("train tok/s", "train_tokens_per_s", "{:,.0f}"),
    ("fwd GFLOP/s", "forward_gflops", "{:.0f}"),
    ("train GFLOP/s", "train_gflops", "{:.0f}"),
    ("fwd % peak", "forward_pct_peak", "{:.0f}%"),
    ("train % peak", "train_pct_peak", "{:.0f}%"),
    ("train peak MB", "train_peak_mb", "{:,.0f}"),
    ("fwd vs torch", "forward_vs_torch", "{:.2f}x"),
    ("train vs torch", "train_vs_torch", "{:.2f}x"),
    ("max |Δ logp|", "max_abs_dlogp", "{:.1e}"),
    ("decode tok/s", "decode_tokens_per_s", "{:,.0f}"),
    ("compile s", "compile_s", "{:.1f}"),
    ("fwd speed-up, compiled", "forward_compile_speedup", "{:.2f}x"),
    ("train speed-up, compiled", "train_compile_speedup", "{:.2f}x"),
]
COMPILE_COLUMNS = {"compile_s", "forward_compile_speedup", "train_compile_speedup"}


def table_rows(block: dict, show_compile: bool, show_decode: bool) -> tuple[list[str], list[list[str]]]:
    columns = [c for c in COLUMNS if (show_compile or c[1] not in COMPILE_COLUMNS)
               and (show_decode or c[1] != "decode_tokens_per_s")]
    lines = []
    for result in block["rows"]:
        line = []
        for _, key, fmt in columns:
            mode = next((m for m in ("forward", "train", "decode") if key.startswith(m)), None)
            error = result.get(f"{mode}_error") if mode else None
            value = result.get(key)
            if error and key in ("forward_ms", "train_ms", "decode_tokens_per_s"):
                line.append("OOM" if error == "OOM" else "error")
            elif value is None:
                line.append("-")
            elif fmt is None:  # a time with its spread
                line.append(f"{value:.1f} ({result[key.replace('_ms', '_iqr_ms')]:.1f})")
            else:
                line.append(fmt(value) if callable(fmt) else fmt.format(value))
        lines.append(line)
    return [c[0] for c in columns], lines


def header_line(meta: dict, block: dict) -> str:
    device = block["device"]
    model = meta["gpu_model"] if device == "cuda" else meta["cpu_model"]
    precision_mode = f"{block['dtype']} (autocast)" if meta["autocast"] else block["dtype"]
    if meta["compile"]:
        precision_mode += " · torch.compile" + (" with freezing" if meta["freeze"] else "")
    return (f"{device}: {model} · {meta['threads']} threads · torch {meta['torch']} · "
            f"{precision_mode} · preset {meta['preset']} · batch {block['batch']} × src "
            f"{block['src_len']} × tgt {block['tgt_len']} · matmul peak "
            f"{block['matmul_peak_gflops']:,.0f} GFLOP/s")


def notes(meta: dict, block: dict) -> list[str]:
    lines = []
    for result in block["rows"]:
        for mode in ("forward", "train", "decode"):
            error = result.get(f"{mode}_error")
            if error and error != "OOM":
                lines.append(f"{result['variant']} {mode}: {error}")
        if result["dlogp_error"]:
            lines.append(f"{result['variant']} log-prob check: {result['dlogp_error']}")
    reference = next((r for r in block["rows"] if r["variant"] == REFERENCE), None)
    if reference is not None:
        used = "uses" if reference["torch_fast_path"] else "does not use"
        lines.append(f"torch forward {used} nn.Transformer's fused eval fast path"
                     + ("" if reference["torch_fast_path"] else
                        " (disabled, or autocast/another condition turned it off)"))
        if reference["torch_fast_path"] and meta["autocast"] and block["device"] == "cpu":
            # its guard asks torch.is_autocast_enabled(), which only answers for CUDA
            lines.append("  ...under CPU autocast too, where its fused kernels run in float32")
    lines.append(f"allocator: {meta['allocator']}")
    return lines


def render(report: dict, fmt: str) -> str:
    meta = report["meta"]
    if fmt == "json":
        return json.dumps(report, indent=2)
    block_keys = ("device", "dtype", "batch", "src_len", "tgt_len")
    if fmt == "csv":
        import csv
        import io

        buffer = io.StringIO()
        records = [{**{k: b[k] for k in block_keys}, **r} for b in report["blocks"] for r in b["rows"]]
        writer = csv.DictWriter(buffer, fieldnames=list(records[0]) if records else list(block_keys))
        writer.writeheader()
        writer.writerows(records)
        return buffer.getvalue()
    parts = []
    for block in report["blocks"]:
        headers, lines = table_rows(block, meta["compile"], meta["decode_len"] > 1)
        parts.append("\n".join([header_line(meta, block), tabulate(lines, headers, tablefmt=fmt,
                                                                   disable_numparse=True),
                                *(f"  {note}" for note in notes(meta, block))]))
    return "\n\n".join(parts) + "\n"


# --- the command line --------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr (exit status 2), not the usage block."""

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive(kind: type) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(prog="compare.py", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="cpu",
                        help="where to run; 'all' = cpu, and cuda when present (default cpu)")
    parser.add_argument("--preset", choices=tuple(PRESETS), default="small",
                        help="model size; base = the paper's 512/8/6/2048/37000 (default small)")
    parser.add_argument("--batch", type=positive(int), nargs="+",
                        help="batch size(s), paired with the lengths (default: the preset's)")
    parser.add_argument("--src-len", type=positive(int), nargs="+", help="source length(s)")
    parser.add_argument("--tgt-len", type=positive(int), nargs="+",
                        help="target length(s) (default: the source lengths)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), nargs="+", default=["float32"],
                        help="one block per dtype; the model is cast to it (default float32)")
    parser.add_argument("--autocast", action="store_true",
                        help="keep float32 weights and run under torch.autocast(dtype) instead")
    parser.add_argument("--dropout", type=probability, help="dropout (default: the config's 0.1)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each model; compile time and the speed-up over eager "
                             "(timed in the same rounds) get their own columns")
    parser.add_argument("--freeze", action="store_true",
                        help="with --compile: inductor freezing for the eval forward (weights folded "
                             "in as constants; the CPU inference setting)")
    parser.add_argument("--variants", choices=VARIANTS, nargs="+", default=list(VARIANTS),
                        metavar="VARIANT", help=f"subset of {', '.join(VARIANTS)} (default all)")
    parser.add_argument("--threads", type=positive(int), default=torch.get_num_threads(),
                        help=f"CPU threads (default {torch.get_num_threads()})")
    parser.add_argument("--format", choices=FORMATS, default="github", metavar="FORMAT",
                        help="a tabulate style (github, grid, latex, ...), json or csv (default github)")
    parser.add_argument("--output", metavar="FILE", help="write the table here instead of stdout")
    parser.add_argument("--rounds", type=positive(int), default=3,
                        help="interleaved rounds over the variants, merged per cell (default 3)")
    parser.add_argument("--min-run-time", type=positive(float), default=0.4, metavar="SECONDS",
                        help="blocked_autorange time per cell and round (default 0.4)")
    parser.add_argument("--decode-len", type=positive(int), default=16, metavar="L",
                        help="greedy-decoding length incl. BOS for the decode column; 1 skips it "
                             "(default 16)")
    parser.add_argument("--no-torch-fast-path", action="store_true",
                        help="turn off nn.Transformer's fused eval kernels (torch.backends.mha)")
    parser.add_argument("--malloc", choices=("keep", "default"), default="keep",
                        help="keep: glibc keeps freed memory (see keep_freed_memory); default: leave it")
    parser.add_argument("--seed", type=int, default=0, help="weights and batch seed (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)

    fields, default_batch, default_len = PRESETS[args.preset]
    max_len = TransformerConfig(**fields).max_seq_len
    args.batch = args.batch or [default_batch]
    args.src_len = args.src_len or [default_len]
    args.tgt_len = args.tgt_len or args.src_len
    counts = {len(v) for v in (args.batch, args.src_len, args.tgt_len)} - {1}
    if len(counts) > 1:
        parser.error("--batch, --src-len and --tgt-len pair up: give each one value or the same "
                     "number of values")
    n_shapes = max(counts, default=1)
    batches, src_lens, tgt_lens = (values * n_shapes if len(values) == 1 else values
                                   for values in (args.batch, args.src_len, args.tgt_len))
    args.shapes = list(zip(batches, src_lens, tgt_lens, strict=True))
    too_long = sorted({n for _, s, t in args.shapes for n in (s, t) if n > max_len})
    if too_long:
        parser.error(f"length {too_long[-1]} exceeds the {args.preset} preset's max_seq_len {max_len}")
    if args.decode_len > max_len:
        parser.error(f"--decode-len {args.decode_len} exceeds the {args.preset} preset's "
                     f"max_seq_len {max_len}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here "
                     f"(torch {torch.__version__}, cuda {torch.version.cuda})")
    if args.freeze and not args.compile:
        parser.error("--freeze is an option of --compile; give both")
    args.devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if not torch.cuda.is_available():
        args.devices = [d for d in args.devices if d != "cuda"]
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        parser.error(f"--output {args.output}: its directory does not exist")
    args.variants = [v for v in VARIANTS if v in args.variants]  # registry order, no repeats
    return args


def preset_config(args: argparse.Namespace) -> TransformerConfig:
    fields = PRESETS[args.preset][0]
    if args.dropout is not None:
        fields = {**fields, "dropout": args.dropout}
    return TransformerConfig(**fields)


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                   cpu)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu_model": cpu, "gpu_model": gpu, "nproc": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    allocator = keep_freed_memory() if args.malloc == "keep" else "glibc default (--malloc default)"
    torch.set_num_threads(args.threads)
    if args.no_torch_fast_path:
        torch.backends.mha.set_fastpath_enabled(False)
    progress = Progress(args.quiet)
    config = preset_config(args)
    meta = {**machine(), "threads": args.threads, "torch": torch.__version__, "preset": args.preset,
            "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
            "autocast": args.autocast, "compile": args.compile, "freeze": args.freeze,
            "decode_len": args.decode_len,
            "rounds": args.rounds, "min_run_time": args.min_run_time, "allocator": allocator,
            "flops": "forward_flops (compare.py); train step = 3x forward",
            "command": " ".join(["compare.py", *(sys.argv[1:] if argv is None else argv)])}
    blocks = []
    for device in args.devices:
        for dtype_name in args.dtype:
            for shape in args.shapes:
                blocks.append(run_block(args, device, dtype_name, shape, progress))
    text = render({"meta": meta, "blocks": blocks}, args.format)
    if args.output:
        with open(args.output, "w") as out:
            out.write(text)
        progress(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
