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

from benchmarks.compare.measured import Cell, Row
from benchmarks.compare.ratios import CONTROL_KEY, DECODE_BASELINE, DECODE_VS_BASELINE, paired_ratio
from benchmarks.compare.settings import Settings
from benchmarks.compare.steps import DECODE_MODES
from benchmarks.compare.timing import Peak
from benchmarks.compare.workload import Shape, forward_flops, train_flops
from common.bfloat16 import bfloat16_support
from variants import REFERENCE


def machine() -> dict:
    """The CPU's and GPU's model names and the CPU count."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                   cpu)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu_model": cpu, "gpu_model": gpu, "nproc": os.cpu_count()}


def meta(settings: Settings, allocator: str, cores_during: dict | None = None) -> dict:
    """The report's header: the machine (whether its CPU multiplies bfloat16 natively among
    it), how busy its cores were before and during the run (``benchmarks.compare.machine``), the
    settings, the allocator policy and the command."""
    s = settings
    choice = s.thread_choice.as_dict() if s.thread_choice else {}
    cores = {**choice, **(cores_during or {})}
    contended = bool(cores.get("contended_before") or cores.get("contended_during"))
    support = bfloat16_support("cpu")
    return {**machine(), "bfloat16_cpu": {"native": support.native, "reason": support.reason},
            "threads": s.threads, "cores": cores, "contended": contended,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "torch": torch.__version__, "preset": s.preset,
            "config": dataclasses.asdict(s.config), "autocast": s.autocast, "compile": s.compile,
            "freeze": s.freeze, "decode_len": s.decode_len, "all_decoders": s.all_decoders,
            "rounds": s.rounds, "min_run_time": s.min_run_time, "control": s.control,
            "order_seed": s.order_seed, "replace_weights": s.replacing, "resolution": s.resolution,
            "max_seconds": s.max_seconds if s.resolution is not None else None, "allocator": allocator,
            "flops": "forward_flops (benchmarks/compare/workload.py); train step = 3x forward",
            "command": s.command}


def block_result(device: str, dtype_name: str, shape: Shape, peak: Peak | None, rows: list[dict], *,
                 float32_matmul_precision: str, small_shape_warning: str | None = None,
                 rounds: dict | None = None, control: dict | None = None, seed: int = 0) -> dict:
    """One block: where and what it ran, its matmul peak (the best GEMM shape, its spread, its
    rounds, every shape's rate), the float32 matmul precision in force, a CUDA shape too small
    to be compute-bound, how its rounds ran (``rounds``: their orders and the cores' load), a
    result per timed row and the control's (torch timed again as a row of its own), every
    ratio paired by round (``add_ratios``)."""
    block = {"device": device, "dtype": dtype_name, "batch": shape.batch, "src_len": shape.src_len,
             "tgt_len": shape.tgt_len, **matmul_peak_fields(peak),
             "float32_matmul_precision": float32_matmul_precision,
             "small_shape_warning": small_shape_warning, "rounds": rounds or {},
             "rows": rows, "control": control}
    add_ratios(block, seed)
    return block


def matmul_peak_fields(peak: Peak | None) -> dict:
    """The block's matmul peak fields; None each where the peak was not measured (a process
    after the first of several: the pooled report keeps the first's)."""
    if peak is None:
        return dict.fromkeys(("matmul_peak_gflops", "matmul_peak_iqr_gflops", "matmul_peak_rounds_gflops",
                              "matmul_peak_shape", "matmul_peak_by_shape_gflops"))
    return {"matmul_peak_gflops": peak.flops_per_second / 1e9,
            "matmul_peak_iqr_gflops": peak.iqr_flops_per_second / 1e9,
            "matmul_peak_rounds_gflops": [flops / 1e9 for flops in peak.rounds],
            "matmul_peak_shape": "x".join(map(str, peak.shape)),
            "matmul_peak_by_shape_gflops": {"x".join(map(str, gemm)): flops / 1e9
                                            for gemm, flops in peak.by_shape.items()}}


def row_result(row: Row, settings: Settings, shape: Shape, peak_flops: float | None) -> dict:
    """One variant's columns: per mode its error, time, rates, peak memory and each round's
    time (``{mode}_rounds_s``: seconds per step, per generated id for decoding), from which
    ``add_ratios`` makes the ratios; then the correctness check, compile time, whether the
    torch fast path ran, and the key/value cache's bytes."""
    flops = {"forward": forward_flops(settings.config, *shape),
             "train": train_flops(settings.config, *shape)}
    params = sum(p.numel() for p in row.model.parameters()) if row.model is not None else None
    result: dict = {"variant": row.variant, "params": params, **rounds_fields(row, settings.modes)}
    for mode in (m for m in settings.modes if m in row.cells):
        cell = row.cells[mode]
        if mode.endswith("_eager"):
            continue
        if mode in DECODE_MODES:
            result[f"{mode}_tokens_per_s"] = ratio(row.decode_positions.get(mode), cell.seconds)
            continue
        result.update(speed(mode, cell, flops[mode], peak_flops))
        result[f"{mode}_peak_mb"] = row.peak_mb.get(mode)
        if mode == "train":
            result["train_tokens_per_s"] = ratio(shape.batch * (shape.src_len + shape.tgt_len),
                                                 cell.seconds)
            result["train_page_faults_per_step"] = ratio(cell.page_faults, cell.calls)
    cross, per_token = row.cache_bytes or (None, None)
    if "decode" in settings.modes:
        result |= {"cache_bytes_per_token": per_token, "cache_cross_bytes": cross}
    return {**result, "max_abs_dlogp": row.max_abs_dlogp, "dlogp_error": row.dlogp_error,
            "compile_s": row.compile_s, "torch_fast_path": row.fast_path,
            "sdpa_backend": row.sdpa_backends.get("forward"),
            "sdpa_backend_train": row.sdpa_backends.get("train")}


def rounds_fields(row: Row, modes: tuple[str, ...]) -> dict:
    """What the ratios are made of, so far: per mode each round's time (``{mode}_rounds_s``:
    seconds per step, per generated id for decoding) and its error, and whether the row's model
    decodes with a key/value cache (None: no model of its own, an engine's row, which does)."""
    fields: dict = {"has_cache": bool(getattr(row.model, "has_cache", False))
                    if row.model is not None else None}
    for mode in (m for m in modes if m in row.cells):
        cell = row.cells[mode]
        per_unit = row.decode_positions.get(mode, 1) if mode in DECODE_MODES else 1
        fields[f"{mode}_rounds_s"] = [seconds / per_unit for seconds in cell.rounds] if per_unit else []
        if not mode.endswith("_eager"):
            fields[f"{mode}_error"] = cell.error
    return fields


# Ratios against the reference row, paired by round: (key, mode)
VS_TORCH = [(f"{mode}_vs_torch", mode) for mode in ("forward", "train", *DECODE_MODES)]
# Ratios inside one row, paired by round: (key, numerator mode, denominator mode)
WITHIN_ROW = [("forward_compile_speedup", "forward_eager", "forward"),  # eager / compiled
              ("train_compile_speedup", "train_eager", "train"),
              ("decode_cache_speedup", "decode_uncached", "decode"),  # per generated id
              ("beam_step_vs_greedy", "beam", "decode")]


def add_ratios(block: dict, seed: int = 0) -> None:
    """Every ratio of ``block``'s rows and its control from their rounds (``benchmarks.compare.ratios``),
    with its interval: ``key``, ``key_low``, ``key_high``; and for each ×torch, ``key_resolved``:
    whether it is told apart from 1, i.e. its interval leaves 1 out and it lies outside the
    control's interval (torch against itself) for that mode."""
    reference = next((row for row in block["rows"] if row["variant"] == REFERENCE), None)
    control = block.get("control")
    baseline = next((row for row in block["rows"] if row["variant"] == DECODE_BASELINE), None)
    for row in [*block["rows"], *([control] if control else [])]:
        for key, mode in VS_TORCH:
            if f"{mode}_rounds_s" in row:
                top, bottom, processes = rounds_of(row, reference, mode)
                found = paired_ratio(top, bottom, **processes, seed=seed)
                row.update(found.as_dict(key) if found else empty_ratio(key))
        for key, top, bottom in WITHIN_ROW:
            if f"{top}_rounds_s" in row and f"{bottom}_rounds_s" in row:
                numerators, denominators, processes = rounds_of(row, row, top, bottom)
                found = paired_ratio(numerators, denominators, **processes, seed=seed)
                row.update(found.as_dict(key) if found else empty_ratio(key))
    for row in block["rows"]:  # cached against cached: not the rows that recompute (has_cache False)
        if "decode_rounds_s" in row and row.get("has_cache") is not False:
            top, bottom, processes = rounds_of(row, baseline, "decode")
            found = paired_ratio(top, bottom, **processes, seed=seed)
            row.update(found.as_dict(DECODE_VS_BASELINE) if found else empty_ratio(DECODE_VS_BASELINE))
    for row in block["rows"]:
        for key in (*(key for key, _ in VS_TORCH), DECODE_VS_BASELINE):
            if row.get(key) is not None:
                row[f"{key}_resolved"] = resolved(row, key, control)


def empty_ratio(key: str) -> dict[str, None]:
    """A ratio that could not be made (a row or a step missing), in the report's form."""
    return dict.fromkeys((key, f"{key}_low", f"{key}_high"))


def rounds_of(top_row: dict, bottom_row: dict | None, top: str, bottom: str | None = None
              ) -> tuple[list[float], list[float], dict[str, list[int] | None]]:
    """The numerator's and denominator's round times of a paired ratio, and each one's rounds'
    processes (None but in a pooled report, ``benchmarks.compare.processes``), as ``paired_ratio``'s
    keywords; empty where the denominator's row is missing or a step failed."""
    bottom = bottom or top
    if bottom_row is None or top_row.get(f"{top}_error") or bottom_row.get(f"{bottom}_error"):
        return [], [], {}
    return (top_row.get(f"{top}_rounds_s", []), bottom_row.get(f"{bottom}_rounds_s", []),
            {"processes": top_row.get(f"{top}_rounds_process"),
             "denominator_processes": bottom_row.get(f"{bottom}_rounds_process")})


def resolved(row: dict, key: str, control: dict | None) -> bool:
    """Whether ``row``'s ``key`` is told apart from 1: an interval that leaves 1 out, and a
    value outside the control's interval for the same mode (when the run had a control)."""
    low, high, value = row.get(f"{key}_low"), row.get(f"{key}_high"), row[key]
    if low is None or low <= 1.0 <= high:
        return False
    control_key = CONTROL_KEY.get(key, key)
    if control and control.get(f"{control_key}_low") is not None:
        return not control[f"{control_key}_low"] <= value <= control[f"{control_key}_high"]
    return True


def speed(mode: str, cell: Cell, flops: int, peak_flops: float | None) -> dict:
    """A timed mode's median and IQR in ms, its GFLOP/s and its share of the matmul peak (None
    where the peak was not measured)."""
    seconds = cell.seconds
    if not seconds:
        return dict.fromkeys((f"{mode}_ms", f"{mode}_iqr_ms", f"{mode}_gflops", f"{mode}_pct_peak"))
    share = 100 * flops / seconds / peak_flops if peak_flops else None
    return {f"{mode}_ms": seconds * 1e3, f"{mode}_iqr_ms": cell.measurement.iqr * 1e3,
            f"{mode}_gflops": flops / seconds / 1e9, f"{mode}_pct_peak": share}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is zero."""
    return numerator / denominator if numerator is not None and denominator else None
