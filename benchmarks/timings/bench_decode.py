"""Decoding timings: one benchmark group per device and shape, a row per (variant, decoder).

    pytest benchmarks/timings/bench_decode.py                     # CPU, and CUDA when present

The decoders are those of compare.py --all-decoders (``benchmarks.compare.steps.DECODE_MODES``): greedy
with the key/value cache (the torch reference has none: it recomputes), greedy by full
recompute, and beam search of 4. The library's small preset, the shared padded batch, random
weights: no row ends early, so every call decodes ``MAX_LEN - 1`` positions per source. Speed is
reported, never asserted.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.compare.steps import DECODE_MODES, decode_steps
from benchmarks.timings.bench_speed import CONFIG, DEVICES, model_on, synchronised
from common.random_batch import random_batch
from variants import REFERENCE, VARIANTS, build

SHAPES = [(8, 32)]  # (batch, src_len)
MAX_LEN = 17  # ids per row, BOS included: 16 decoding steps


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return build(REFERENCE, CONFIG, seed=0)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}xS{}".format(*s))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", DECODE_MODES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_decode(benchmark, variant, mode, device, shape, reference):
    model = model_on(variant, device, reference).eval()
    batch = random_batch(CONFIG, shape[0], shape[1], 1, device=device)
    step = decode_steps(model, batch, MAX_LEN)[mode]
    benchmark.group = f"decode {device} B={shape[0]} S={shape[1]} L={MAX_LEN}"
    benchmark.extra_info["positions"] = shape[0] * (MAX_LEN - 1)
    tokens = benchmark(synchronised(step, device))
    assert tokens.shape[0] == shape[0] and tokens.shape[1] <= MAX_LEN
