"""What each variant's LayerNorm costs, forward + backward, at the base model's width.

    pytest benchmarks/timings/bench_layernorm.py --benchmark-columns=median,iqr

explicit writes LayerNorm out from its formula and lets autograd differentiate it op by op;
mathfirst writes out the formula and its derived gradient (``LayerNormFunction``); einsum and
fused use ``nn.LayerNorm`` and the reference ``torch.nn.Transformer``'s, all the fused kernel. The
difference, times the 32 norms of the base model, is most of what separates their train steps
in compare.py's table.
"""

from __future__ import annotations

import pytest
import torch

from common.config import TransformerConfig
from variants import REFERENCE, VARIANTS, build

CONFIG = TransformerConfig(n_layers=1, src_vocab_size=10, tgt_vocab_size=10)  # d_model 512
SHAPE = (8, 128, CONFIG.d_model)  # the base preset's 8 x 128 batch


@pytest.mark.parametrize("variant", VARIANTS)
def test_layernorm_forward_backward(benchmark, variant):
    model = build(variant, CONFIG, seed=0)
    # the encoder's final norm: every variant has one, reached through its own module tree
    norm = model.get_submodule("transformer.encoder.norm" if variant == REFERENCE else "encoder.norm")
    x = torch.randn(SHAPE, requires_grad=True, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))
    benchmark.group = f"LayerNorm forward + backward {SHAPE}"
    benchmark(lambda: norm(x).backward(grad))
    assert torch.isfinite(x.grad).all()
