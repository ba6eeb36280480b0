"""Source 3's "verify before assembling": each math-first component against a property the paper
states for it. Expected values come from the paper's equations, never from the code under test."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import small_config
from variants.mathfirst.components import (
    LayerNorm,
    LayerNormFunction,
    MultiHeadAttention,
    PositionwiseFeedForward,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    attention_weights,
    positional_encoding_table,
    scaled_dot_product_attention,
)

F64 = torch.float64


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (biases, gamma and beta too), so no term can hide behind a 0 or 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return module.double().eval()


def rotation(angle: torch.Tensor) -> torch.Tensor:
    """(..., 2, 2) matrices [[cos a, sin a], [-sin a, cos a]]."""
    cos, sin = torch.cos(angle), torch.sin(angle)
    return torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)


# --- positional encoding (section 3.5) ------------------------------------------------------


@pytest.mark.parametrize("d_model", [32, 33])
def test_positional_encoding_is_the_papers_formula(d_model):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), written here in the
    paper's power form (the module uses the exp/log form)."""
    pe = positional_encoding_table(60, d_model)
    assert pe.dtype == F64 and pe.shape == (60, d_model)
    for column in range(d_model):
        two_i = column - column % 2
        angle = torch.arange(60, dtype=F64) / 10000.0 ** (two_i / d_model)
        expected = torch.sin(angle) if column % 2 == 0 else torch.cos(angle)
        torch.testing.assert_close(pe[:, column], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("offset", [1, 2, 5, 17])
def test_positional_encoding_shift_is_a_fixed_rotation(offset):
    """For every frequency w_i, (PE(pos+k, 2i), PE(pos+k, 2i+1)) is (PE(pos, 2i), PE(pos, 2i+1))
    rotated by k w_i: one matrix per (k, i), the same for every pos (section 3.5: PE(pos+k) is a
    linear function of PE(pos))."""
    d_model, max_len = 32, 200
    pe = positional_encoding_table(max_len, d_model)
    pairs = pe.view(max_len, d_model // 2, 2)  # (pos, i, [sin, cos])
    frequency = 1.0 / 10000.0 ** (torch.arange(0, d_model, 2, dtype=F64) / d_model)  # (D/2,)
    matrices = rotation(offset * frequency)  # (D/2, 2, 2), independent of pos
    shifted = torch.einsum("iab,pib->pia", matrices, pairs[:-offset])
    torch.testing.assert_close(shifted, pairs[offset:], atol=1e-12, rtol=0)


@pytest.mark.parametrize("d_model", [32, 33])
def test_positional_encoding_marian_is_the_papers_columns_sines_first(d_model):
    """Marian: PE(pos) = [sin(pos ω_0) … | cos(pos ω_0) …], ω_i = 1 / 10000^(2i/d), written here in
    the power form, column by column."""
    pe = positional_encoding_table(60, d_model, "marian")
    sines = (d_model + 1) // 2
    pos = torch.arange(60, dtype=F64)
    for column in range(d_model):
        i = column if column < sines else column - sines
        angle = pos / 10000.0 ** (2 * i / d_model)
        expected = torch.sin(angle) if column < sines else torch.cos(angle)
        torch.testing.assert_close(pe[:, column], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("d_model", [32, 33])
@pytest.mark.parametrize("pad_id", [0, 1])
def test_positional_encoding_fairseq_starts_after_the_padding_id(d_model, pad_id):
    """fairseq: PE(pos) = [sin(q ω_k) … | cos(q ω_k) …], ω_k = 1 / 10000^(k/(D/2 − 1)),
    q = pos + pad_id + 1, an odd width ending in a zero column; written here in the power form."""
    pe = positional_encoding_table(60, d_model, "fairseq", pad_id)
    half = d_model // 2
    q = torch.arange(60, dtype=F64) + pad_id + 1
    for k in range(half):
        angle = q / 10000.0 ** (k / (half - 1))
        torch.testing.assert_close(pe[:, k], torch.sin(angle), atol=1e-12, rtol=0)
        torch.testing.assert_close(pe[:, half + k], torch.cos(angle), atol=1e-12, rtol=0)
    if d_model % 2:
        assert pe[:, -1].abs().max() == 0


def test_positional_encoding_adds_the_table_in_the_input_dtype():
    config = small_config(dropout=0.0)
    module = SinusoidalPositionalEncoding(config).eval()
    assert module.pe.dtype == F64
    assert "pe" not in module.state_dict()  # derived, not a weight
    x = torch.randn(2, 7, config.d_model)
    out = module(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x + positional_encoding_table(7, config.d_model).float())


def test_positional_encoding_applies_dropout_in_training():
    config = small_config(dropout=0.5)
    module = SinusoidalPositionalEncoding(config).train()
    out = module(torch.ones(4, 9, config.d_model))
    assert (out == 0).any()


# --- token embedding (section 3.4) ----------------------------------------------------------


def test_embedding_is_the_table_row_times_sqrt_d_model():
    config = small_config()
    embedding = TokenEmbedding(config, vocab_size=11)
    ids = torch.tensor([[0, 3, 10, 3], [7, 7, 1, 2]])
    out = embedding(ids)
    assert out.shape == (2, 4, config.d_model)
    expected = torch.stack([torch.stack([embedding.E[t] for t in row]) for row in ids.tolist()])
    torch.testing.assert_close(out, expected * math.sqrt(config.d_model), atol=0, rtol=1e-6)


# --- LayerNorm (section 3.1) ----------------------------------------------------------------


def test_layer_norm_standardises_each_position_before_gamma_and_beta():
    """Undoing gamma and beta leaves zero mean and unit (biased) variance at every position."""
    config = small_config(norm_eps=1e-12)
    norm = randomize(LayerNorm(config))
    x = 3.0 * torch.randn(4, 6, config.d_model, dtype=F64) + 5.0
    standardised = (norm(x) - norm.beta) / norm.gamma
    torch.testing.assert_close(standardised.mean(-1), torch.zeros(4, 6, dtype=F64), atol=1e-10, rtol=0)
    torch.testing.assert_close(standardised.var(-1, unbiased=False), torch.ones(4, 6, dtype=F64),
                               atol=1e-10, rtol=0)


def test_layer_norm_puts_eps_inside_the_square_root():
    """A constant row has variance 0: the output is beta, and a tiny variance is scaled by
    1/sqrt(var + eps), not 1/(std + eps)."""
    config = small_config(norm_eps=1e-2)
    norm = randomize(LayerNorm(config))
    flat = torch.full((1, 1, config.d_model), 4.0, dtype=F64)
    torch.testing.assert_close(norm(flat)[0, 0], norm.beta.detach())
    x = torch.tensor([1.0, -1.0], dtype=F64).repeat(config.d_model // 2)[None, None] * 0.1
    standardised = (norm(x) - norm.beta) / norm.gamma  # x has mean 0 and variance 0.01
    torch.testing.assert_close(standardised, x / math.sqrt(0.01 + 1e-2))


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 5)], ids=["2d", "3d"])
def test_layer_norm_gradient_matches_finite_differences(shape):
    """The hand-derived gradient (LayerNormFunction.backward) against central differences of the
    forward, for x, gamma and beta, at any number of leading axes."""
    config = small_config(d_model=shape[-1], n_heads=1, norm_eps=1e-5)
    norm = randomize(LayerNorm(config))
    x = torch.randn(shape, dtype=F64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, gamma, beta: LayerNormFunction.apply(x, gamma, beta, norm.eps),
                                    (x, norm.gamma, norm.beta))


def test_layer_norm_refuses_a_second_derivative():
    """The derived gradient is not itself differentiable; a double backward must raise, not be wrong."""
    config = small_config()
    norm = randomize(LayerNorm(config))
    x = torch.randn(2, 3, config.d_model, dtype=F64, requires_grad=True)
    (grad_x,) = torch.autograd.grad(norm(x).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="marked with @once_differentiable"):
        grad_x.sum().backward()


# --- position-wise feed-forward (section 3.3) -----------------------------------------------


def test_feed_forward_treats_each_position_independently():
    config = small_config()
    ffn = randomize(PositionwiseFeedForward(config, config.d_ff))
    x = torch.randn(3, 8, config.d_model, dtype=F64)
    y = ffn(x)
    changed = x.clone()
    changed[1, 5] = torch.randn(config.d_model, dtype=F64)
    y_changed = ffn(changed)
    assert not torch.allclose(y_changed[1, 5], y[1, 5])
    keep = torch.ones(3, 8, dtype=torch.bool)
    keep[1, 5] = False
    torch.testing.assert_close(y_changed[keep], y[keep], atol=0, rtol=0)
    permutation = torch.randperm(8)
    torch.testing.assert_close(ffn(x[:, permutation]), y[:, permutation])


def test_feed_forward_is_the_equation():
    """max(0, x W_1 + b_1) W_2 + b_2, one position at a time."""
    config = small_config()
    ffn = randomize(PositionwiseFeedForward(config, config.d_ff))
    x = torch.randn(2, 3, config.d_model, dtype=F64)
    with torch.no_grad():
        expected = torch.stack([torch.stack([
            torch.clamp(x[b, s] @ ffn.W_1 + ffn.b_1, min=0) @ ffn.W_2 + ffn.b_2
            for s in range(3)]) for b in range(2)])
        torch.testing.assert_close(ffn(x), expected)


@pytest.mark.parametrize(("activation", "phi"), [
    ("relu", lambda z: torch.where(z > 0, z, torch.zeros_like(z))),
    ("gelu", lambda z: z * 0.5 * torch.special.erfc(-z / math.sqrt(2.0))),  # z Φ(z)
    ("silu", lambda z: z / (1.0 + torch.exp(-z))),  # z σ(z)
])
def test_feed_forward_applies_the_configs_phi(activation, phi):
    """φ(x W_1 + b_1) W_2 + b_2 with φ the config's activation, at the width the layer is given
    (the decoder's may differ from the encoder's)."""
    config = small_config(activation=activation)
    ffn = randomize(PositionwiseFeedForward(config, 24))
    assert ffn.W_1.shape == (config.d_model, 24) and ffn.W_2.shape == (24, config.d_model)
    x = torch.randn(2, 3, config.d_model, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), phi(x @ ffn.W_1 + ffn.b_1) @ ffn.W_2 + ffn.b_2,
                                   atol=1e-12, rtol=0)


# --- attention (section 3.2) ----------------------------------------------------------------


def test_attention_rows_sum_to_one_and_ignore_masked_keys():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=generator)
    k = torch.randn(2, 3, 7, 8, generator=generator)
    mask = torch.rand(2, 1, 5, 7, generator=generator) < 0.6
    mask[..., 0] = True  # every query keeps at least one key
    weights = attention_weights(q, k, mask)
    assert weights.shape == (2, 3, 5, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
    assert (weights.masked_select(mask.expand_as(weights)) > 0).all()


def test_fully_masked_row_is_uniform_and_finite():
    """docs/architecture.md: masked scores are filled with finfo.min, never -inf, so no NaN appears."""
    q, k = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[True, False, True], [False, False, False]])[None, None]
    weights = attention_weights(q, k, mask)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights[0, 0, 1], torch.full((3,), 1 / 3))


def test_scaled_dot_product_attention_is_equation_one():
    """softmax(Q K^T / sqrt(d_k)) V, computed row by row from the definition of softmax."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 6, generator=generator, dtype=F64),
               torch.randn(5, 6, generator=generator, dtype=F64),
               torch.randn(5, 3, generator=generator, dtype=F64))
    out = scaled_dot_product_attention(q, k, v)
    for t in range(4):
        scores = torch.tensor([float(q[t] @ k[s]) / math.sqrt(6) for s in range(5)], dtype=F64)
        softmax = scores.exp() / scores.exp().sum()
        torch.testing.assert_close(out[t], softmax @ v)


def test_one_head_equals_single_head_attention():
    """MultiHead with H = 1 is Attention(X W_q + b_q, X W_k + b_k, X W_v + b_v) W_o + b_o with
    d_k = d_model (section 3.2.2), computed here with plain matrix products."""
    config = small_config(n_heads=1)
    mha = randomize(MultiHeadAttention(config))
    x, memory = torch.randn(2, 5, config.d_model, dtype=F64), torch.randn(2, 7, config.d_model, dtype=F64)
    mask = torch.rand(2, 1, 5, 7) < 0.7
    mask[..., 0] = True
    with torch.no_grad():
        W_q, W_k, W_v, W_o = mha.W_q[0], mha.W_k[0], mha.W_v[0], mha.W_o[0]  # (D, D)
        q, k, v = x @ W_q + mha.b_q[0], memory @ W_k + mha.b_k[0], memory @ W_v + mha.b_v[0]
        scores = (q @ k.transpose(-1, -2) / math.sqrt(config.d_model)).masked_fill(~mask[:, 0], -math.inf)
        expected = torch.softmax(scores, dim=-1) @ v @ W_o + mha.b_o
        torch.testing.assert_close(mha(x, memory, memory, mask), expected)


def test_heads_are_independent_slices_of_the_projections():
    """head_h depends only on W_q^h, W_k^h, W_v^h: changing one head's weights changes only
    that head's attention map."""
    config = small_config()
    mha = randomize(MultiHeadAttention(config))
    x = torch.randn(2, 5, config.d_model, dtype=F64)
    with torch.no_grad():
        before = mha.attention_map(x, x)
        mha.W_k[2] += 1.0
        after = mha.attention_map(x, x)
    assert before.shape == (2, config.n_heads, 5, 5)
    others = [h for h in range(config.n_heads) if h != 2]
    torch.testing.assert_close(after[:, others], before[:, others], atol=0, rtol=0)
    assert not torch.allclose(after[:, 2], before[:, 2])


def test_attention_dropout_drops_weights_only_in_training():
    config = small_config(dropout=0.5)
    mha = MultiHeadAttention(config)
    x = torch.randn(2, 6, config.d_model)
    torch.manual_seed(0)
    train_out = mha.train()(x, x, x)
    eval_out = mha.eval()(x, x, x)
    assert not torch.allclose(train_out, eval_out)
    torch.testing.assert_close(mha(x, x, x), eval_out, atol=0, rtol=0)
