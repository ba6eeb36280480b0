"""The Transformer's components, each written from its equation in the paper, in its notation.

Parameters carry the paper's names and layouts and are applied as ``x @ W + b``: per-head
projections ``W_q, W_k, W_v`` of shape (H, D, Dh), the output projection ``W_o`` (H, Dh, D),
the feed-forward ``W_1`` (D, F) and ``W_2`` (F, D), LayerNorm's gain and bias ``gamma, beta``
and the embedding table ``E``. ``einops.einsum`` names the axes, so each contraction reads as
the sum it stands for. Every component is verified on its own in
``tests/variants/style/test_mathfirst.py`` before ``model.py`` assembles them.

Shape legend:
    B  batch            S  source length (or key length)   T  target length (or query length)
    H  heads            Dh head dim (d_k = d_v)           D  model dim (d_model)
    F  feed-forward dim V  vocabulary size                 L  max_seq_len
    t  positions decoded so far, this one included (a cached decode step's keys)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from common.cache import LayerCache
from common.config import TransformerConfig
from common.masks import mask_scores


def xavier_uniform(*shape: int, fan_in: int, fan_out: int) -> nn.Parameter:
    """Xavier-uniform, with the fans of the whole matrix (not of one head's slice)."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class TokenEmbedding(nn.Module):
    """Embedding(x) = E[x] · √d_model   (section 3.4).

    E is the learned (V, D) table; the √d_model scale keeps the embedding's magnitude
    comparable to the positional encoding added next.
    """

    def __init__(self, config: TransformerConfig, vocab_size: int) -> None:
        super().__init__()
        self.E = nn.Parameter(torch.randn(vocab_size, config.d_model) * config.d_model**-0.5)  # (V, D)
        self.scale = math.sqrt(config.d_model)

    def forward(self, ids: Tensor) -> Tensor:
        return self.E[ids] * self.scale  # (B, S, D)


def positional_encoding_table(max_len: int, d_model: int, positions: str = "paper",
                              pad_id: int = 0) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))
    (section 3.5); (L, D) in float64.

    The frequencies 1 / 10000^(2i/d_model) are computed as exp(2i · (−ln 10000 / d_model)).
    An odd d_model has one more sine column than cosine columns.

    ``positions`` names the layout (``TransformerConfig.positions``): "paper" interleaves as
    above; checkpoints trained elsewhere put the sines in one half and the cosines in the other,

        "marian":   PE(pos) = [sin(pos ω_0), …, sin(pos ω_{D/2−1}) | cos(pos ω_0), …, cos(pos ω_{D/2−1})],
                    ω_i = 1 / 10000^(2i/d_model), the paper's frequencies;
        "fairseq":  PE(pos) = [sin(q ω_0), …, sin(q ω_{D/2−1}) | cos(q ω_0), …, cos(q ω_{D/2−1})],
                    ω_k = 1 / 10000^(k/(D/2 − 1)),  q = pos + pad_id + 1, its first position
                    after the padding id's (an odd d_model ends in a zero column).
    """
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (L, 1)
    if positions == "fairseq":
        half = d_model // 2
        omega = torch.exp(torch.arange(half, dtype=torch.float64) * (-math.log(10000.0) / (half - 1)))
        q_omega = (pos + pad_id + 1) * omega  # (L, D/2)
        zero = torch.zeros(max_len, d_model % 2, dtype=torch.float64)
        return torch.cat([torch.sin(q_omega), torch.cos(q_omega), zero], dim=-1)  # (L, D)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    div_term = torch.exp(two_i * (-math.log(10000.0) / d_model))  # (ceil(D/2),)
    angle = pos * div_term  # (L, ceil(D/2))
    if positions == "marian":
        return torch.cat([torch.sin(angle), torch.cos(angle[:, : d_model // 2])], dim=-1)  # (L, D)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe  # (L, D)


class SinusoidalPositionalEncoding(nn.Module):
    """x + PE[:S], then dropout   (sections 3.5 and 5.4).

    The table is a float64 buffer that is not saved with the weights, cast to the
    activations' dtype where it is added, so float64 runs are exact.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.register_buffer("pe", positional_encoding_table(config.max_seq_len, config.d_model,
                                                             config.positions, config.pad_id),
                             persistent=False)  # (L, D) float64
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x holds positions start, start + 1, ...: a decode step at position t adds PE[t]."""
        return self.dropout(x + self.pe[start : start + x.shape[1]].to(x.dtype))  # (B, S, D)


class LayerNorm(nn.Module):
    """LayerNorm(x) = γ ⊙ (x − μ) / √(σ² + ε) + β   (section 3.1; Ba et al., 2016).

    μ and σ² are the mean and the biased variance of each position's D features. The forward
    pass and its gradient are both written out from the equations, in ``LayerNormFunction``.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.eps = config.norm_eps
        self.gamma = nn.Parameter(torch.ones(config.d_model))  # (D,)
        self.beta = nn.Parameter(torch.zeros(config.d_model))  # (D,)

    def forward(self, x: Tensor) -> Tensor:
        return LayerNormFunction.apply(x, self.gamma, self.beta, self.eps)  # (B, S, D)


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm with its gradient derived by hand, as the equations give it.

    Forward, for one position x ∈ ℝᴰ, with ⟨·⟩ the mean over its D features:

        μ = ⟨x⟩,   σ² = ⟨(x − μ)²⟩,   s = √(σ² + ε),   x̂ = (x − μ) / s,   y = γ ⊙ x̂ + β

    Backward. Let g = ∂L/∂y ⊙ γ = ∂L/∂x̂. Since Σⱼ (xⱼ − μ) = 0, ∂σ²/∂xᵢ = 2 (xᵢ − μ) / D, so
    ∂s/∂xᵢ = x̂ᵢ / D and

        ∂x̂ⱼ/∂xᵢ = (δᵢⱼ − 1/D − x̂ᵢ x̂ⱼ / D) / s

    Summing g over j:

        ∂L/∂x = (g − ⟨g⟩ − x̂ ⊙ ⟨g ⊙ x̂⟩) / s

    The two means take away what μ and σ² absorb: the parts of g along the constant vector and
    along x̂. Over all positions, ∂L/∂γ = Σ ∂L/∂y ⊙ x̂ and ∂L/∂β = Σ ∂L/∂y.
    ``tests/variants/style/test_mathfirst.py`` checks the derivation against finite differences
    (``gradcheck``).
    """

    @staticmethod
    def forward(ctx, x: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
        mu = x.mean(dim=-1, keepdim=True)  # (B, S, 1)
        sigma2 = (x - mu).square().mean(dim=-1, keepdim=True)  # (B, S, 1) biased variance
        s = torch.sqrt(sigma2 + eps)  # (B, S, 1)
        x_hat = (x - mu) / s  # (B, S, D)
        ctx.save_for_backward(x_hat, s, gamma)
        return gamma * x_hat + beta  # (B, S, D)

    @staticmethod
    @once_differentiable  # the derived gradient is not itself differentiable: say so, loudly
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        x_hat, s, gamma = ctx.saved_tensors
        g = grad_y * gamma  # (B, S, D) ∂L/∂x̂
        grad_x = (g - g.mean(dim=-1, keepdim=True) - x_hat * (g * x_hat).mean(dim=-1, keepdim=True)) / s
        positions = tuple(range(grad_y.dim() - 1))  # every axis but D
        return grad_x, (grad_y * x_hat).sum(positions), grad_y.sum(positions), None


def attention_weights(Q: Tensor, K: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q Kᵀ / √d_k) with masked keys filled before the softmax   (section 3.2.1).

    Q (..., T, Dh) and K (..., S, Dh) give (..., T, S): each row sums to 1 and gives
    exactly 0 to a masked key (a fully masked row is uniform, see common.masks).
    """
    d_k = Q.shape[-1]
    scores = einsum(Q, K, "... t k, ... s k -> ... t s") / math.sqrt(d_k)  # (B, H, T, S): Q Kᵀ / √d_k
    return mask_scores(scores, mask).softmax(dim=-1)  # (B, H, T, S)


def scaled_dot_product_attention(
    Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> Tensor:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V   (section 3.2.1, eq. 1).

    ``mask`` is bool, True = may attend, broadcastable to (..., T, S); ``dropout_p`` drops
    attention weights (section 5.4), as in ``torch.nn.functional.scaled_dot_product_attention``.
    """
    A = F.dropout(attention_weights(Q, K, mask), p=dropout_p)  # (B, H, T, S)
    return A @ V  # (B, H, T, Dh)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, …, head_H) W_o + b_o,
    head_h = Attention(Q W_q^h + b_q^h, K W_k^h + b_k^h, V W_v^h + b_v^h)   (section 3.2.2).

    Concat(heads) W_o is written as the sum over heads of head_h W_o^h, with W_o stored as
    (H, Dh, D): the same product without building the concatenation.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        H, D, Dh = config.n_heads, config.d_model, config.head_dim
        self.dropout_p = config.dropout
        self.W_q = xavier_uniform(H, D, Dh, fan_in=D, fan_out=D)  # (H, D, Dh)
        self.W_k = xavier_uniform(H, D, Dh, fan_in=D, fan_out=D)  # (H, D, Dh)
        self.W_v = xavier_uniform(H, D, Dh, fan_in=D, fan_out=D)  # (H, D, Dh)
        self.W_o = xavier_uniform(H, Dh, D, fan_in=D, fan_out=D)  # (H, Dh, D)
        self.b_q = nn.Parameter(torch.zeros(H, Dh))  # (H, Dh)
        self.b_k = nn.Parameter(torch.zeros(H, Dh))  # (H, Dh)
        self.b_v = nn.Parameter(torch.zeros(H, Dh))  # (H, Dh)
        self.b_o = nn.Parameter(torch.zeros(D))  # (D,)

    def forward(self, Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
        # Q W_q^h + b_q^h, K W_k^h + b_k^h, V W_v^h + b_v^h for every head h at once:
        # Q_h (B, H, T, Dh), K_h and V_h (B, H, S, Dh)
        Q_h = einsum(Q, self.W_q, "b t d, h d k -> b h t k") + rearrange(self.b_q, "h k -> h 1 k")
        K_h = einsum(K, self.W_k, "b s d, h d k -> b h s k") + rearrange(self.b_k, "h k -> h 1 k")
        V_h = einsum(V, self.W_v, "b s d, h d k -> b h s k") + rearrange(self.b_v, "h k -> h 1 k")
        # head_h = Attention(Q_h, K_h, V_h), dropout on its weights while training
        dropout_p = self.dropout_p if self.training else 0.0
        heads = scaled_dot_product_attention(Q_h, K_h, V_h, mask, dropout_p)  # (B, H, T, Dh)
        # Concat(head_1, …, head_H) W_o + b_o = Σ_h head_h W_o^h + b_o
        return einsum(heads, self.W_o, "b h t k, h k d -> b t d") + self.b_o  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def step(self, x_t: Tensor, cache: LayerCache, mask: Tensor | None = None) -> Tensor:
        """Masked self-attention of position t, x_t (B, 1, D), over positions 1..t:

            K_{1:t} = [K_{1:t-1}; x_t W^K + b^K],    V_{1:t} = [V_{1:t-1}; x_t W^V + b^V]
            head_h = Attention(x_t W_q^h + b_q^h, K_{1:t}^h, V_{1:t}^h)

        K_{1:t-1} and V_{1:t-1} are the cache's; it holds K_{1:t} and V_{1:t} afterwards (in
        place). Row t of Q Kᵀ depends on x_t and the rows of K up to t only — causality — so
        this is row t of the full MultiHead(X, X, X) under the causal mask.
        """
        k_t, v_t = self.keys_values(x_t, x_t)  # (B, H, 1, Dh) each
        cache.self_keys = torch.cat([cache.self_keys, k_t], dim=-2)  # K_{1:t}: (B, H, t, Dh)
        cache.self_values = torch.cat([cache.self_values, v_t], dim=-2)  # V_{1:t}: (B, H, t, Dh)
        return self.attend(x_t, cache.self_keys, cache.self_values, mask)  # (B, 1, D)

    def keys_values(self, K: Tensor, V: Tensor) -> tuple[Tensor, Tensor]:
        """``forward``'s K_h = K W_k^h + b_k^h and V_h = V W_v^h + b_v^h: 2 x (B, H, S, Dh)."""
        return _per_head(K, self.W_k, self.b_k), _per_head(V, self.W_v, self.b_v)

    def attend(self, Q: Tensor, K_h: Tensor, V_h: Tensor, mask: Tensor | None = None) -> Tensor:
        """The rest of ``forward``: MultiHead(Q, K, V) with K_h and V_h already projected,
        (B, H, S, Dh) each."""
        dropout_p = self.dropout_p if self.training else 0.0
        Q_h = _per_head(Q, self.W_q, self.b_q)  # (B, H, T, Dh)
        heads = scaled_dot_product_attention(Q_h, K_h, V_h, mask, dropout_p)  # (B, H, T, Dh)
        return einsum(heads, self.W_o, "b h t k, h k d -> b t d") + self.b_o  # (B, T, D)

    # --- what the heads look at: the suite's addition, not the source's ---

    def attention_map(self, Q: Tensor, K: Tensor, mask: Tensor | None = None) -> Tensor:
        """Every head's softmax(Q W_q^h (K W_k^h)ᵀ / √d_k): (B, H, T, S), for pictures."""
        return attention_weights(_per_head(Q, self.W_q, self.b_q), _per_head(K, self.W_k, self.b_k), mask)


def _per_head(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """x W^h + b^h for every head h at once, as ``MultiHeadAttention.forward`` writes it out:
    (B, T, D) -> (B, H, T, Dh). For the suite's additions above."""
    return einsum(x, W, "b t d, h d k -> b h t k") + rearrange(b, "h k -> h 1 k")  # (B, H, T, Dh)


def gelu(z: Tensor) -> Tensor:
    """GELU(z) = z Φ(z), Φ the standard normal CDF: z · ½ (1 + erf(z / √2))."""
    return z * 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))


def silu(z: Tensor) -> Tensor:
    """SiLU(z) = z σ(z), also called swish."""
    return z * torch.sigmoid(z)


# φ in FFN(x) = φ(x W_1 + b_1) W_2 + b_2: the paper's max(0, z), or a checkpoint's config.activation
ACTIVATIONS = {"relu": torch.relu, "gelu": gelu, "silu": silu}


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2   (section 3.3, eq. 2), with dropout before W_2.

    The same two matrices act on every position separately. ``d_ff`` is the inner width F (the
    decoder's may differ: config.decoder_ff_dim); config.activation may put another φ in place
    of max(0, ·).
    """

    def __init__(self, config: TransformerConfig, d_ff: int) -> None:
        super().__init__()
        D = config.d_model
        self.phi = ACTIVATIONS[config.activation]
        self.W_1 = xavier_uniform(D, d_ff, fan_in=D, fan_out=d_ff)  # (D, F)
        self.b_1 = nn.Parameter(torch.zeros(d_ff))  # (F,)
        self.W_2 = xavier_uniform(d_ff, D, fan_in=d_ff, fan_out=D)  # (F, D)
        self.b_2 = nn.Parameter(torch.zeros(D))  # (D,)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.phi(x @ self.W_1 + self.b_1)  # (B, S, F): φ(x W_1 + b_1), max(0, ·) in the paper
        return self.dropout(hidden) @ self.W_2 + self.b_2  # (B, S, D)
