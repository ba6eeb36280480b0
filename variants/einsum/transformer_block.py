"""The block of source 2 that is both the encoder layer and the decoder's cross-attention half.

Shape legend:
    B  batch            S  key/value length (the source's, or T in self-attention)
    T  query length     D  model dim (d_model)    F  feed-forward dim (d_ff)
    H  heads            Dh head dim
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from torch import Tensor, nn

from common.activations import activation_module
from common.config import TransformerConfig
from variants.einsum.self_attention import SelfAttention


class TransformerBlock(nn.Module):
    """Attention of ``query`` over ``key``/``value``, then the feed-forward network, each in a residual.

    One class, two roles (the point of this style): called as ``block(out, out, out, mask)`` it is
    an encoder layer (self-attention); inside ``DecoderBlock``, called as
    ``block(enc_out, enc_out, query, src_mask)``, it is cross-attention + feed-forward. The
    residual is added to the query, so the output keeps the query's length whatever the keys'.

    post-norm (the paper):  x = norm(x + dropout(sublayer(x)))
    pre-norm:               x = x + dropout(sublayer(norm(x)))

    In pre-norm, "norm(x)" is the query's: keys and values are normalised only when they *are*
    the query (``key is query``, the identity test ``nn.MultiheadAttention`` also uses to spot
    self-attention), so self-attention attends over its normalised input, as in
    ``nn.TransformerEncoderLayer``, and cross-attention reads the encoder output as given.
    """

    def __init__(self, config: TransformerConfig, d_ff: int) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.attention = SelfAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        # FFN(x) = linear2(dropout(relu(linear1(x)))), as nn.TransformerEncoderLayer places it;
        # F = d_ff, the encoder's or the decoder's width, and ReLU unless config.activation says otherwise
        self.feed_forward = nn.Sequential(OrderedDict(
            linear1=nn.Linear(config.d_model, d_ff),  # D -> F
            activation=activation_module(config),
            dropout=nn.Dropout(config.dropout),
            linear2=nn.Linear(d_ff, config.d_model),  # F -> D
        ))
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, value: Tensor, key: Tensor, query: Tensor, mask: Tensor | None) -> Tensor:
        """(B, S, D) value and key, (B, T, D) query -> (B, T, D)."""
        def attention(normed: Tensor) -> Tensor:
            # self-attention's value and key are its query, so normalised with it in pre-norm;
            # the encoder output in cross-attention is another tensor, attended over as given
            value_in = normed if value is query else value  # (B, S, D)
            key_in = normed if key is query else key  # (B, S, D)
            return self.attention(value_in, key_in, normed, mask)  # (B, T, D)

        x = self.residual(query, self.norm1, attention)  # (B, T, D): the residual is the query
        return self.residual(x, self.norm2, self.feed_forward)  # (B, T, D)

    def residual(self, x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """One sublayer around x, its input normalised (pre-norm) or its sum (post-norm)."""
        if self.norm_first:
            return x + self.dropout(sublayer(norm(x)))  # (B, T, D)
        return norm(x + self.dropout(sublayer(x)))  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def step(self, values: Tensor, keys: Tensor, query: Tensor, mask: Tensor | None) -> Tensor:
        """The decoder role for one new position, query (B, 1, D), decoding with a cache: the
        attention reads values and keys projected once per source, (B, S, H, Dh) each."""
        x = self.residual(query, self.norm1, lambda normed: self.attention.attend(values, keys, normed, mask))
        return self.residual(x, self.norm2, self.feed_forward)  # (B, 1, D)
