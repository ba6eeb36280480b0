"""What ``torch.nn.Transformer`` initialises, as ``common.weights.init_canonical``'s docstring
says it differs from the canonical initialisation: Xavier-uniform on every matrix with the fans
of the parameter as torch holds it (the fused in_proj_weight is one (3D, D) matrix), zero
attention biases, and feed-forward biases left at nn.Linear's default U(±1/sqrt(fan_in)).

The bounds are read off the samples: the largest |w| of at least 256 U(-a, a) draws lies
within 5% of a (the chance it does not is below 0.95**256, about 2e-6), and never above it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

D, F = 256, 512  # at least 256 draws in every tensor checked, biases included


def assert_uniform_bound(tensor: torch.Tensor, bound: float, name: str) -> None:
    largest = tensor.detach().abs().max().item()
    assert 0.95 * bound < largest <= bound, f"{name}: max |w| {largest:.4f}, bound {bound:.4f}"


def test_nn_transformer_initialises_as_the_canonical_docstring_says():
    torch.manual_seed(0)
    model = nn.Transformer(d_model=D, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=F, batch_first=True)
    layer = model.decoder.layers[0]
    for attention in (layer.self_attn, layer.multihead_attn):
        # the fused (3D, D) matrix: a = sqrt(6 / 4D), not the sqrt(6 / 2D) of one (D, D) block
        assert attention.in_proj_weight.shape == (3 * D, D)
        assert_uniform_bound(attention.in_proj_weight, math.sqrt(6 / (4 * D)), "in_proj_weight")
        assert_uniform_bound(attention.out_proj.weight, math.sqrt(6 / (2 * D)), "out_proj.weight")
        assert not attention.in_proj_bias.any() and not attention.out_proj.bias.any()
    assert_uniform_bound(layer.linear1.weight, math.sqrt(6 / (D + F)), "linear1.weight")
    assert_uniform_bound(layer.linear2.weight, math.sqrt(6 / (F + D)), "linear2.weight")
    # nn.Linear's default bias, U(-1/sqrt(fan_in), 1/sqrt(fan_in)): not zeroed by torch
    assert_uniform_bound(layer.linear1.bias, 1 / math.sqrt(D), "linear1.bias")
    assert_uniform_bound(layer.linear2.bias, 1 / math.sqrt(F), "linear2.bias")
    assert torch.equal(layer.norm1.weight, torch.ones(D)) and not layer.norm1.bias.any()
