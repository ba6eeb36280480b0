"""The report: what a run measured as plain data (a dict, which is also the JSON output).

    {"meta": {machine, settings, command}, "blocks": [{device, dtype, shape, matmul peak,
     "rows": [{variant, times, rates, peak memory, ratios to the reference, ...}]}]}
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform

import torch

from benchmarks.measured import Cell, Row
from benchmarks.settings import Settings
from benchmarks.steps import DECODE_MODES
from benchmarks.timing import Peak, rounds_disagree, rounds_spread
from benchmarks.workload import Shape, forward_flops, train_flops


def machine() -> dict:
    """The CPU's and GPU's model names and the CPU count."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                   cpu)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu_model": cpu, "gpu_model": gpu, "nproc": os.cpu_count()}


def meta(settings: Settings, allocator: str, cores_during: dict | None = None) -> dict:
    """The report's header: the machine, how busy its cores were before and during the run
    (``benchmarks.machine``), the settings, the allocator policy and the command."""
    s = settings
    choice = s.thread_choice.as_dict() if s.thread_choice else {}
    cores = {**choice, **(cores_during or {})}
    contended = bool(cores.get("contended_before") or cores.get("contended_during"))
    return {**machine(), "threads": s.threads, "cores": cores, "contended": contended,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "torch": torch.__version__, "preset": s.preset,
            "config": dataclasses.asdict(s.config), "autocast": s.autocast, "compile": s.compile,
            "freeze": s.freeze, "decode_len": s.decode_len, "all_decoders": s.all_decoders,
            "rounds": s.rounds, "min_run_time": s.min_run_time, "allocator": allocator,
            "flops": "forward_flops (benchmarks/workload.py); train step = 3x forward",
            "command": s.command}


def block_result(device: str, dtype_name: str, shape: Shape, peak: Peak, rows: list[dict], *,
                 float32_matmul_precision: str, small_shape_warning: str | None = None) -> dict:
    """One block: where and what it ran, its matmul peak (the best GEMM shape, its spread, its
    rounds, every shape's rate), the float32 matmul precision in force, a CUDA shape too small
    to be compute-bound, and a result per timed row."""
    return {"device": device, "dtype": dtype_name, "batch": shape.batch, "src_len": shape.src_len,
            "tgt_len": shape.tgt_len, "matmul_peak_gflops": peak.flops_per_second / 1e9,
            "matmul_peak_iqr_gflops": peak.iqr_flops_per_second / 1e9,
            "matmul_peak_rounds_gflops": [flops / 1e9 for flops in peak.rounds],
            "matmul_peak_shape": "x".join(map(str, peak.shape)),
            "matmul_peak_by_shape_gflops": {"x".join(map(str, gemm)): flops / 1e9
                                            for gemm, flops in peak.by_shape.items()},
            "float32_matmul_precision": float32_matmul_precision,
            "small_shape_warning": small_shape_warning, "rows": rows}


def row_result(row: Row, settings: Settings, shape: Shape, peak_flops: float, reference: Row) -> dict:
    """One variant's columns: per mode its error, time, rates, peak memory and ratio to the
    reference; then the correctness check, compile time and whether the torch fast path ran."""
    flops = {"forward": forward_flops(settings.config, *shape),
             "train": train_flops(settings.config, *shape)}
    params = sum(p.numel() for p in row.model.parameters()) if row.model is not None else None
    result: dict = {"variant": row.variant, "params": params}
    for mode in (m for m in settings.modes if not m.endswith("_eager") and m in row.cells):
        cell = row.cells[mode]
        result[f"{mode}_error"] = cell.error
        result[f"{mode}_rounds_spread"] = rounds_spread(cell.rounds)
        result[f"{mode}_rounds_disagree"] = rounds_disagree(cell.rounds)
        if mode in DECODE_MODES:
            result[f"{mode}_tokens_per_s"] = ratio(row.decode_positions.get(mode), cell.seconds)
            continue
        result.update(speed(mode, cell, flops[mode], peak_flops))
        result[f"{mode}_peak_mb"] = row.peak_mb.get(mode)
        result[f"{mode}_vs_torch"] = ratio(cell.seconds, seconds_of(reference, mode))
        if mode == "train":
            result["train_tokens_per_s"] = ratio(shape.batch * (shape.src_len + shape.tgt_len),
                                                 cell.seconds)
            result["train_page_faults_per_step"] = ratio(cell.page_faults, cell.calls)
    for mode in ("forward", "train"):  # with compile: eager time / compiled time
        speedup = ratio(seconds_of(row, f"{mode}_eager"), seconds_of(row, mode))
        if speedup is not None:
            result[f"{mode}_compile_speedup"] = speedup
    if "decode" in settings.modes:
        result.update(decode_ratios(row, reference))
    return {**result, "max_abs_dlogp": row.max_abs_dlogp, "dlogp_error": row.dlogp_error,
            "compile_s": row.compile_s, "torch_fast_path": row.fast_path,
            "sdpa_backend": row.sdpa_backends.get("forward"),
            "sdpa_backend_train": row.sdpa_backends.get("train")}


def decode_ratios(row: Row, reference: Row) -> dict:
    """Greedy decoding's time per generated id against the reference's (torch: full recompute)
    and against its own full recompute; beam search's time per step against greedy's (one step
    per generated position); the key/value cache's bytes per source, per decoded id and once
    for the encoder output's keys and values (None without a cache)."""
    per_id = {mode: ratio(seconds_of(row, mode), row.decode_positions.get(mode))
              for mode in DECODE_MODES}
    reference_per_id = ratio(seconds_of(reference, "decode"), reference.decode_positions.get("decode"))
    cross, per_token = row.cache_bytes or (None, None)
    return {"decode_vs_torch": ratio(per_id["decode"], reference_per_id),
            "decode_cache_speedup": ratio(per_id["decode_uncached"], per_id["decode"]),
            "beam_step_vs_greedy": ratio(per_id["beam"], per_id["decode"]),
            "cache_bytes_per_token": per_token, "cache_cross_bytes": cross}


def speed(mode: str, cell: Cell, flops: int, peak_flops: float) -> dict:
    """A timed mode's median and IQR in ms, its GFLOP/s and its share of the matmul peak."""
    seconds = cell.seconds
    if not seconds:
        return dict.fromkeys((f"{mode}_ms", f"{mode}_iqr_ms", f"{mode}_gflops", f"{mode}_pct_peak"))
    return {f"{mode}_ms": seconds * 1e3, f"{mode}_iqr_ms": cell.measurement.iqr * 1e3,
            f"{mode}_gflops": flops / seconds / 1e9, f"{mode}_pct_peak": 100 * flops / seconds / peak_flops}


def seconds_of(row: Row, mode: str) -> float | None:
    """The median step time of ``row``'s ``mode``, if it has one."""
    cell = row.cells.get(mode)
    return cell.seconds if cell else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is zero."""
    return numerator / denominator if numerator is not None and denominator else None
