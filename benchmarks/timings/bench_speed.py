"""Forward and train-step timings: one benchmark group per device, shape and mode, a row per variant.

    pytest benchmarks/                                   # CPU, and CUDA when present
    pytest benchmarks/ --benchmark-autosave              # save under .benchmarks/
    pytest benchmarks/ --benchmark-compare               # against the latest saved run

The work is compare.py's (the library's small preset, the shared padded batch, its forward and
forward + backward steps), so the numbers line up with its table; the shapes are kept small so
the whole run takes a few minutes on two cores. Speed is reported, never asserted.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.compare.steps import forward_backward, forward_step
from benchmarks.compare.workload import TIMING_PRESETS, forward_flops, train_flops
from common.checks import check_forward, ids_range_checked
from common.config import TransformerConfig
from common.random_batch import random_batch
from common.weights import transfer
from variants import REFERENCE, VARIANTS, build

CONFIG = TransformerConfig(**TIMING_PRESETS["small"].fields)
SHAPES = [(8, 32, 32), (4, 128, 128)]  # (batch, src_len, tgt_len)
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                      reason="needs a CUDA device")]),
]


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return build(REFERENCE, CONFIG, seed=0)


def model_on(variant: str, device: str, reference: torch.nn.Module) -> torch.nn.Module:
    model = build(variant, CONFIG)
    transfer(reference, model)  # every row computes the same function
    return model.to(device)


def synchronised(step, device: str):
    """pytest-benchmark times the call; on CUDA the call must include the kernels' work.
    The step's result is handed back, so the test can check what the timed call computed.
    On CUDA the ids' range is not re-read each call (a host sync): the test checked it once."""
    if device != "cuda":
        return step

    def run():
        with ids_range_checked():
            result = step()
        torch.cuda.synchronize()
        return result

    return run


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}xS{}xT{}".format(*s))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_forward(benchmark, variant, device, shape, reference):
    model = model_on(variant, device, reference).eval()
    batch = random_batch(CONFIG, *shape, device=device)
    benchmark.group = f"forward {device} B={shape[0]} S={shape[1]} T={shape[2]}"
    benchmark.extra_info["gflop"] = forward_flops(CONFIG, *shape) / 1e9
    check_forward(model, *batch.inputs())  # once, outside the timed calls
    logp = benchmark(synchronised(forward_step(model, batch), device))
    assert torch.isfinite(logp).all()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}xS{}xT{}".format(*s))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_train_step(benchmark, variant, device, shape, reference):
    model = model_on(variant, device, reference).train()
    batch = random_batch(CONFIG, *shape, device=device)
    benchmark.group = f"train step {device} B={shape[0]} S={shape[1]} T={shape[2]}"
    benchmark.extra_info["gflop"] = train_flops(CONFIG, *shape) / 1e9
    check_forward(model, *batch.inputs())  # once, outside the timed calls
    benchmark(synchronised(forward_backward(model, batch), device))
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
