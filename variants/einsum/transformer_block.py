"""The block of source 2 that is both the encoder layer and the decoder's cross-attention half.

Shape legend:
    B  batch            S  source length (the memory's length)
    T  query length     D  model dim (d_model)    F  feed-forward dim (d_ff)
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor, nn

from common.config import TransformerConfig
from variants.einsum.self_attention import SelfAttention


class TransformerBlock(nn.Module):
    """Attention of a query over a memory, then the feed-forward network, each in a residual.

    One class, two roles (the point of this style): alone it is an encoder layer (no memory:
    self-attention), inside ``DecoderBlock`` it is cross-attention + feed-forward (memory = the
    encoder output). The residual is added to the query, so the output keeps the query's length
    whatever the memory's.

    post-norm (the paper):  x = norm(x + dropout(sublayer(x)))
    pre-norm:               x = x + dropout(sublayer(norm(x)))
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.attention = SelfAttention(config)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        # FFN(x) = linear2(dropout(relu(linear1(x)))), as nn.TransformerEncoderLayer places it
        self.feed_forward = nn.Sequential(OrderedDict(
            linear1=nn.Linear(config.d_model, config.d_ff),  # D -> F
            relu=nn.ReLU(),
            dropout=nn.Dropout(config.dropout),
            linear2=nn.Linear(config.d_ff, config.d_model),  # F -> D
        ))
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, query: Tensor, mask: Tensor | None, memory: Tensor | None = None) -> Tensor:
        """(B, T, D) query, optional (B, S, D) memory -> (B, T, D)."""
        if self.norm_first:
            x = query + self.dropout(self.attend(self.norm1(query), mask, memory))
            return x + self.dropout(self.feed_forward(self.norm2(x)))
        x = self.norm1(query + self.dropout(self.attend(query, mask, memory)))
        return self.norm2(x + self.dropout(self.feed_forward(x)))

    def attend(self, query: Tensor, mask: Tensor | None, memory: Tensor | None) -> Tensor:
        """Attention of ``query`` over ``memory``, or over ``query`` itself when there is none."""
        # The caller says *what* to attend over, never how to normalise it. Self-attention passes
        # no memory, so keys and values are the query exactly as the block prepared it: in
        # pre-norm the normalised query, one norm1 serving Q, K and V as in
        # nn.TransformerEncoderLayer. Cross-attention passes the encoder output, used as given,
        # so pre-norm normalises the decoder's query only. One rule covers both roles; the block
        # needs no flag saying which role it plays, and no caller reaches into its norm1.
        keys_values = query if memory is None else memory  # (B, T, D) or (B, S, D)
        return self.attention(keys_values, keys_values, query, mask)  # (B, T, D)
