"""Every row's LayerNorm modules against a float64 reference, on inputs whose mean dwarfs
their spread, in float32, bfloat16 and float16.

A two-pass LayerNorm (the mean, then the mean square of x − mean) in a dtype of machine
epsilon eps rounds the mean to within a few eps·|μ| and each later operation to within about
eps of its result, so the output y = γ·x̂ + β (x̂ = (x − μ)/σ) is off by at most about

    BOUND_FACTOR · eps · (|γ| · (|μ| / σ + |x̂|) + |β|)

— linear in |μ|/σ. The variance written as E[x²] − μ² loses it: x² and μ² are rounded at eps·μ²,
so σ² is off by about eps·(μ/σ)² of itself, (μ/σ) times the bound: catastrophic cancellation,
a negative variance (NaN) or a scale off by a large factor. The equivalence tests run on inputs
of mean near 0, where the two forms agree.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor

from common.config import TransformerConfig
from common.probes import resolve_probes
from common.weights import export_weights, import_weights
from tests.helpers import random_canonical
from variants import VARIANTS, build

CONFIG = TransformerConfig(d_model=64, n_heads=2, n_layers=1, d_ff=16, dropout=0.0, src_vocab_size=7,
                           tgt_vocab_size=7, max_seq_len=8)
# |μ| / σ per dtype: as large as the dtype holds with unit spread still resolved (bfloat16 keeps 8
# significant bits, so 100 ± 1 comes in steps of 0.5; float16, 11 bits, in steps of 1/16)
MEAN = {torch.float32: 1e4, torch.bfloat16: 100.0, torch.float16: 100.0}
BOUND_FACTOR = 2.0  # eps is twice the unit roundoff: 4 roundings of each term's size
NORM_POINT = re.compile(r"(^|\.)norm\d?$")


def large_mean_inputs(dtype: torch.dtype) -> Tensor:
    """(2, 3, D): per position mean ±MEAN (the sign alternating), spread about 1, in ``dtype``."""
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(2, 3, CONFIG.d_model, generator=generator, dtype=torch.float64)
    signs = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)[None, :, None]  # (1, 3, 1)
    return (MEAN[dtype] * signs + noise).to(dtype)  # (B, S, D)


def reference_layer_norm(x: Tensor, gain: Tensor, shift: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """float64 γ·(x − μ)/√(σ² + ε) + β with the biased variance, and x̂, from the dtype's inputs."""
    x = x.double()
    mean = x.mean(dim=-1, keepdim=True)  # (B, S, 1)
    variance = (x - mean).square().mean(dim=-1, keepdim=True)  # (B, S, 1)
    normalised = (x - mean) / torch.sqrt(variance + eps)  # (B, S, D)
    return gain.double() * normalised + shift.double(), normalised


@pytest.mark.parametrize("dtype", list(MEAN), ids=str)
@pytest.mark.parametrize("row", VARIANTS)
def test_layer_norm_holds_a_large_mean_within_the_dtype_bound(row, dtype):
    model = build(row, CONFIG)
    import_weights(model, random_canonical(CONFIG, seed=1))  # gains 1 ± 0.3, shifts ± 0.3
    model.to(dtype)
    weights = export_weights(model)
    modules = dict(model.named_modules())
    x = large_mean_inputs(dtype)
    eps = torch.finfo(dtype).eps
    tested = []
    for point, probe in resolve_probes(model).items():
        if probe is None or not NORM_POINT.search(point):
            continue
        gain, shift = weights[f"{point}.weight"], weights[f"{point}.bias"]
        with torch.no_grad():
            actual = modules[probe.module](x).double()  # (B, S, D)
        expected, normalised = reference_layer_norm(x, gain, shift, CONFIG.norm_eps)
        mean = x.double().mean(dim=-1, keepdim=True)  # (B, S, 1)
        scale = mean.abs() / (x.double() - mean).square().mean(dim=-1, keepdim=True).sqrt()  # |μ|/σ
        bound = BOUND_FACTOR * eps * (gain.double().abs() * (scale + normalised.abs()) + shift.double().abs())
        error = (actual - expected).abs()
        assert (error <= bound).all(), (point, error.max().item(), (error / bound).max().item())
        tested.append(point)
    assert len(tested) == 2 * CONFIG.n_layers + 3 * CONFIG.n_layers + 2, tested  # every norm of the model
