"""The CUDA paths that this CPU-only suite cannot run by default, checked as far as a CPU allows,
and end to end where a CUDA device is present (the `gpu` marker; skipped without one)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import benchmarks.compare.failures
from benchmarks.compare.timing import float32_matmul_precision
from benchmarks.compare.workload import TIMING_PRESETS, Shape, small_shape_warning
from benchmarks.timings.bench_speed import synchronised
from common.checks import check_forward, ids_range_checked
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import build

ROOT = Path(__file__).resolve().parents[3]
needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_the_synchronising_wrapper_hands_back_the_steps_result(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(True))
    result = torch.ones(2)
    assert synchronised(lambda: result, "cuda")() is result
    assert synced == [True]  # it still waits for the kernels


def test_out_of_memory_is_caught_on_a_torch_without_torch_out_of_memory_error(monkeypatch):
    monkeypatch.delattr(torch, "OutOfMemoryError")  # as in torch 2.2 and 2.3
    try:
        failures = importlib.reload(benchmarks.compare.failures)
        assert failures.OUT_OF_MEMORY is torch.cuda.OutOfMemoryError
        assert failures.failure_cell(torch.cuda.OutOfMemoryError("CUDA out of memory.")) == "OOM"
        assert failures.failure_cell(ValueError("no")) == "ValueError: no"
    finally:
        monkeypatch.undo()
        importlib.reload(benchmarks.compare.failures)


CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, src_vocab_size=50,
                           tgt_vocab_size=50, max_seq_len=32)


def test_the_range_check_is_skipped_only_inside_ids_range_checked():
    model = build("explicit", CONFIG, seed=0).eval()
    batch = random_batch(CONFIG, 2, 6, 6)
    bad = batch.src.clone()
    bad[0, 0] = CONFIG.src_vocab_size
    with pytest.raises(ValueError, match=r"src ids must lie in \[0, 50\)"):
        model.encode(bad, batch.src_mask)
    with ids_range_checked(), pytest.raises(IndexError):  # the embedding's own error: unchecked
        model.encode(bad, batch.src_mask)
    with pytest.raises(ValueError, match=r"src ids must lie in \[0, 50\)"):  # reset on the way out
        model.encode(bad, batch.src_mask)
    with ids_range_checked(), pytest.raises(ValueError, match="src length 40 exceeds max_seq_len"):
        model.encode(torch.ones(1, 40, dtype=torch.long), None)  # the other checks still run


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_cuda)])
def test_a_prechecked_cuda_forward_makes_no_host_sync(_):
    model = build("fused", CONFIG, seed=0).cuda().eval()
    batch = random_batch(CONFIG, 2, 8, 8, device="cuda")
    check_forward(model, *batch.inputs())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call now raises
    try:
        with torch.no_grad(), ids_range_checked():
            model(*batch.inputs())
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("_", [pytest.param(None, marks=needs_cuda)])
def test_compare_runs_end_to_end_on_cuda(_):
    done = subprocess.run([sys.executable, "compare.py", "--device", "cuda", "--preset", "tiny",
                           "--rounds", "1", "--min-run-time", "0.05"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for variant in ("explicit", "einsum", "mathfirst", "fused", "torch"):
        assert variant in done.stdout
    assert "OOM" not in done.stdout and "Error" not in done.stdout
    assert "float32 (matmuls in " in done.stdout  # TF32 or IEEE float32, the header says which
    assert "warning: batch 4 x 16 tokens" in done.stdout  # the tiny preset is too small for a GPU
    assert "SDPA kernel: fused forward " in done.stdout


def test_the_float32_matmul_precision_follows_torchs_setting():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # TF32 on CUDA
        assert float32_matmul_precision("cuda") == "TF32"
        torch.set_float32_matmul_precision("highest")
        assert float32_matmul_precision("cuda") == "IEEE float32"
    finally:
        torch.set_float32_matmul_precision(before)
    assert float32_matmul_precision("cpu") == "IEEE float32"


@pytest.mark.parametrize("preset, dtype, warned", [
    ("tiny", torch.bfloat16, True), ("small", torch.float32, True), ("small", torch.bfloat16, False),
    ("base", torch.float32, False)])
def test_a_cuda_shape_too_small_to_be_compute_bound_is_named(preset, dtype, warned):
    fields, batch, length = TIMING_PRESETS[preset]
    config, shape = TransformerConfig(**fields), Shape(batch, length, length)
    warning = small_shape_warning(config, shape, dtype)
    assert (warning is not None) == warned
    if warned:
        assert f"d_model {config.d_model}" in warning and "compute-bound" in warning


def test_the_small_shape_bound_is_the_gemms_intensity():
    config = TransformerConfig(d_model=512)
    # bfloat16, D = 512: 2·M·D² / ((2·M·D + D²)·2) = M·D / (2M + D) ≥ 100  <=>  M ≥ 164.1 rows
    assert small_shape_warning(config, Shape(1, 164, 164), torch.bfloat16) is not None
    assert small_shape_warning(config, Shape(1, 165, 200), torch.bfloat16) is None  # the shorter
