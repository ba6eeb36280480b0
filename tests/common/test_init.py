"""``common.weights.init_canonical`` draws what its docstring says, checked against the
distributions themselves: bounds, moments and histograms computed here, not read from a table
that the same code regenerates.

Claimed: matrices Xavier-uniform, U(-a, a) with a = sqrt(6 / (fan_in + fan_out)) of the
canonical (out, in) matrix; biases zero; LayerNorm gain one and bias zero; embeddings
N(0, 1/d_model), so that a token vector scaled by sqrt(d_model) has unit variance per feature.

Statistical checks allow 5 standard errors of each statistic (a failure by chance about once in
a million per check; the seed is fixed, so a pass repeats).
"""

from __future__ import annotations

import math

import pytest
import torch

from common.weights import canonical_shapes, init_canonical
from tests.helpers import small_config

# wide enough for tight statistics (a 256 x 512 matrix has 131,072 entries), built in a blink
CONFIG = small_config(d_model=256, n_heads=4, d_ff=512, n_layers=1, src_vocab_size=500,
                      tgt_vocab_size=300)
SIGMAS = 5.0
STATE = init_canonical(CONFIG, seed=0)


def kind(name: str) -> str:
    if name.endswith("_embed.weight"):
        return "embedding"
    if ".norm" in name or name.startswith(("encoder.norm", "decoder.norm")):
        return "norm gain" if name.endswith(".weight") else "norm bias"
    return "matrix" if len(canonical_shapes(CONFIG)[name]) == 2 else "bias"


def names_of(wanted: str) -> list[str]:
    return [name for name in STATE if kind(name) == wanted]


def test_every_tensor_is_float32_of_its_canonical_shape_and_each_kind_occurs():
    assert {name: tuple(t.shape) for name, t in STATE.items()} == canonical_shapes(CONFIG)
    assert all(t.dtype == torch.float32 for t in STATE.values())
    counts = {k: len(names_of(k)) for k in ("embedding", "matrix", "bias", "norm gain", "norm bias")}
    # 2 tables; 3 attentions x 4 + 2 feed-forwards x 2 + generator; as many biases; 7 + 2 norms
    assert counts == {"embedding": 2, "matrix": 17, "bias": 17, "norm gain": 7, "norm bias": 7}


def test_biases_are_zero_and_norms_are_the_identity():
    for name in names_of("bias") + names_of("norm bias"):
        assert torch.equal(STATE[name], torch.zeros_like(STATE[name])), name
    for name in names_of("norm gain"):
        assert torch.equal(STATE[name], torch.ones_like(STATE[name])), name


@pytest.mark.parametrize("name", names_of("matrix"))
def test_matrices_are_xavier_uniform(name):
    weight = STATE[name].double()
    fan_out, fan_in = weight.shape  # nn.Linear's (out, in)
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    n = weight.numel()
    assert weight.abs().max() <= bound
    # the largest of n uniform draws falls short of the bound by about bound / n
    assert weight.abs().max() >= bound * (1 - 20 / n)
    # U(-a, a): mean 0 (sd a / sqrt(3n)); mean square a^2 / 3 (sd a^2 sqrt(4 / 45 / n))
    assert abs(weight.mean()) <= SIGMAS * bound / math.sqrt(3 * n)
    assert abs(weight.square().mean() - bound**2 / 3) <= SIGMAS * bound**2 * math.sqrt(4 / 45 / n)
    # flat: each tenth of [-a, a] holds a tenth of the entries (binomial sd sqrt(0.09 n))
    counts = torch.histc(weight, bins=10, min=-bound, max=bound)
    assert (counts - n / 10).abs().max() <= SIGMAS * math.sqrt(0.09 * n)


@pytest.mark.parametrize("name", names_of("embedding"))
def test_embeddings_are_normal_with_variance_one_over_d_model(name):
    scaled = STATE[name].double() * math.sqrt(CONFIG.d_model)  # should be N(0, 1)
    n = scaled.numel()
    assert abs(scaled.mean()) <= SIGMAS / math.sqrt(n)
    assert abs(scaled.square().mean() - 1) <= SIGMAS * math.sqrt(2 / n)  # var(z^2) = 2
    # Gaussian, not merely unit variance: the share within one sd is 0.6827
    within = (scaled.abs() < 1).double().mean()
    assert abs(within - math.erf(1 / math.sqrt(2))) <= SIGMAS * math.sqrt(0.6827 * 0.3173 / n)


def test_each_matrix_is_its_own_draw_and_the_seed_fixes_them_all():
    matrices = [STATE[name] for name in names_of("matrix") + names_of("embedding")]
    firsts = [tuple(m.flatten()[:4].tolist()) for m in matrices]
    assert len(set(firsts)) == len(firsts)  # no two tensors start alike: no repeated draw
    again, other = init_canonical(CONFIG, seed=0), init_canonical(CONFIG, seed=1)
    assert all(torch.equal(again[name], STATE[name]) for name in STATE)
    assert not any(torch.equal(other[name], STATE[name]) for name in names_of("matrix"))
