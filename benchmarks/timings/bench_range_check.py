"""What the id-range check's host synchronisation costs a small CUDA forward: the ids' range
read at every call (``aminmax`` then ``int()``, the default) against checked once, outside the
timed calls (``common.checks.ids_range_checked``).

    pytest benchmarks/timings/bench_range_check.py --benchmark-columns=median,iqr     # needs CUDA

The small preset at 8 x 32, where a forward is a few milliseconds of kernel launches and a sync
in front of them shows. On CPU there is no sync to save, so the file runs on CUDA only.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from benchmarks.compare.steps import forward_step
from benchmarks.compare.workload import TIMING_PRESETS
from common.checks import check_forward, ids_range_checked
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import build

CONFIG = TransformerConfig(**TIMING_PRESETS["small"].fields)
RANGE_CHECK = {"every call": contextlib.nullcontext, "checked once, outside": ids_range_checked}

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("range_check", RANGE_CHECK)
@pytest.mark.parametrize("variant", ["fused", "torch"])
def test_forward(benchmark, variant, range_check):
    model = build(variant, CONFIG, seed=0).cuda().eval()
    batch = random_batch(CONFIG, 8, 32, 32, device="cuda")
    check_forward(model, *batch.inputs())
    step, region = forward_step(model, batch), RANGE_CHECK[range_check]

    def run() -> torch.Tensor:
        with region():
            logp = step()
        torch.cuda.synchronize()
        return logp

    benchmark.group = f"CUDA forward, {variant}, small preset, 8 x 32"
    logp = benchmark(run)
    assert torch.isfinite(logp).all()
