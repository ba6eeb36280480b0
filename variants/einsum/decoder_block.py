"""One decoder layer of source 2: masked self-attention, then a TransformerBlock over the encoder output.

Shape legend:
    B  batch            S  source length      T  target length     D  model dim (d_model)
"""

from __future__ import annotations

from torch import Tensor, nn

from common.config import TransformerConfig
from variants.einsum.self_attention import SelfAttention
from variants.einsum.transformer_block import TransformerBlock


class DecoderBlock(nn.Module):
    """Masked self-attention in its residual, then ``TransformerBlock`` as cross-attention + FFN."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.attention = SelfAttention(config)
        self.transformer_block = TransformerBlock(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, value: Tensor, key: Tensor, src_mask: Tensor | None, trg_mask: Tensor | None
    ) -> Tensor:
        """(B, T, D) target, (B, S, D) value and key (the encoder output) -> (B, T, D)."""
        if self.norm_first:  # x + dropout(self_attention(norm(x)))
            normed = self.norm(x)  # (B, T, D)
            query = x + self.dropout(self.attention(normed, normed, normed, trg_mask))  # (B, T, D)
        else:  # norm(x + dropout(self_attention(x)))
            query = self.norm(x + self.dropout(self.attention(x, x, x, trg_mask)))  # (B, T, D)
        # value and key from the encoder, query from the decoder, residual on the query
        return self.transformer_block(value, key, query, src_mask)  # (B, T, D)
