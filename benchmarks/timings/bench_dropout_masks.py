"""What one dropout costs, by where its mask comes from: eager, inductor's own in-kernel masks,
and the suite's compiled steps (benchmarks.compare.dropout_masks: masks from aten, multiply fused).

    pytest benchmarks/timings/bench_dropout_masks.py --benchmark-columns=median,iqr

One 1024 x 2048 float32 tensor (the base model's feed-forward activation at 8 x 128), p = 0.1,
forward only. Alone, inductor's own masks are the cheapest; inside the base train step its
mask kernels cost more per entry than aten's (docs/benchmarks.md, compiled training), which is
why the suite's compiled steps draw them with aten.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.compare.dropout_masks import inductor_with_aten_masks

P_DROP = 0.1
SHAPE = (1024, 2048)


def dropout(x: torch.Tensor) -> torch.Tensor:
    return F.dropout(x, P_DROP, training=True)


DROPOUTS = {
    "eager F.dropout": lambda: dropout,
    "inductor, its own masks": lambda: torch.compile(dropout),
    "inductor, aten masks": lambda: torch.compile(dropout, backend=inductor_with_aten_masks({})),
}
MASKS_ALONE = {
    "bernoulli_ into bool": lambda x: torch.empty_like(x, dtype=torch.bool).bernoulli_(1 - P_DROP),
    "rand > p": lambda x: torch.rand_like(x) > P_DROP,
}


@pytest.mark.parametrize("name", DROPOUTS)
def test_dropout(benchmark, name):
    step = DROPOUTS[name]()
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    step(x)  # compiles
    benchmark.group = f"dropout p={P_DROP} {SHAPE}"
    y = benchmark(step, x)
    kept = (y != 0).double().mean().item()
    assert abs(kept - (1 - P_DROP)) < 0.01


@pytest.mark.parametrize("name", MASKS_ALONE)
def test_mask_alone(benchmark, name):
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    benchmark.group = f"dropout p={P_DROP} {SHAPE}"
    mask = benchmark(MASKS_ALONE[name], x)
    assert abs(mask.double().mean().item() - (1 - P_DROP)) < 0.01
