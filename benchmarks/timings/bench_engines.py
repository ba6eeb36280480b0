"""Cached greedy decoding through the deployment engines beside the suite's rows: one benchmark
group, a row each for fused, torch, ONNX Runtime and CTranslate2 (float32).

    pytest benchmarks/timings/bench_engines.py

The work is benchmarks/timings/bench_decode.py's: the library's small preset, the shared padded batch,
random weights (no row ends early), ``MAX_LEN - 1`` decoding steps per source. The engines
hold the reference's weights, exported once per module (the ONNX export takes a minute).
Speed is reported, never asserted.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.compare.steps import decode_step
from benchmarks.engines.rows import EngineSettings, engine_rows
from benchmarks.timings.bench_decode import MAX_LEN, SHAPES
from benchmarks.timings.bench_speed import CONFIG, model_on
from common.random_batch import random_batch
from variants import REFERENCE, build

pytest.importorskip("onnxruntime", reason="the deploy extra is not installed")
pytest.importorskip("ctranslate2", reason="the deploy extra is not installed")

BATCH, SRC_LEN = SHAPES[0]


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return build(REFERENCE, CONFIG, seed=0).eval()


@pytest.fixture(scope="module")
def batch():
    return random_batch(CONFIG, BATCH, SRC_LEN, 1)


@pytest.fixture(scope="module")
def engines(reference, batch, tmp_path_factory):
    rows = engine_rows(
        reference,
        batch,
        MAX_LEN,
        tmp_path_factory.mktemp("engines"),
        EngineSettings(precisions=("float32",), threads=torch.get_num_threads()),
    )
    return {row.engine: row for row in rows}


@pytest.mark.parametrize("row", ["fused", REFERENCE, "onnxruntime", "ctranslate2"])
def test_greedy_decode(benchmark, row, reference, batch, engines):
    if row in engines:
        step = engines[row].steps["decode"]
    else:
        step = decode_step(model_on(row, "cpu", reference).eval(), batch, MAX_LEN)
    benchmark.group = f"greedy decode cpu B={BATCH} S={SRC_LEN} L={MAX_LEN}"
    benchmark.extra_info["positions"] = BATCH * (MAX_LEN - 1)
    tokens = benchmark(step)
    assert tokens.shape[0] == BATCH and tokens.shape[1] <= MAX_LEN
