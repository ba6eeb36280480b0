"""One decoder layer of source 2: masked self-attention, then a TransformerBlock over the encoder output.

Shape legend:
    B  batch            S  source length      T  target length     D  model dim (d_model)
    H  heads            Dh head dim
    t  positions decoded so far, this one included (a cached decode step's keys)
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from common.cache import LayerCache
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
        self.transformer_block = TransformerBlock(config, config.decoder_ff_dim)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, value: Tensor, key: Tensor, src_mask: Tensor | None, trg_mask: Tensor | None
    ) -> Tensor:
        """(B, T, D) target, (B, S, D) value and key (the encoder output) -> (B, T, D)."""
        query = self.residual(x, lambda normed: self.attention(normed, normed, normed, trg_mask))  # (B, T, D)
        # value and key from the encoder, query from the decoder, residual on the query
        return self.transformer_block(value, key, query, src_mask)  # (B, T, D)

    def residual(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """The masked self-attention around x, its input normalised (pre-norm) or its sum (post-norm)."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))  # (B, T, D)
        return self.norm(x + self.dropout(sublayer(x)))  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def start_cache(self, enc_out: Tensor) -> LayerCache:
        """The transformer block's values and keys of the encoder output, once per source; no
        self-attention value or key yet (the projections of zero positions, (B, 0, H, Dh))."""
        cross_values, cross_keys = self.transformer_block.attention.project(enc_out, enc_out)
        no_position = enc_out[:, :0]  # (B, 0, D)
        self_values, self_keys = self.attention.project(no_position, no_position)
        return LayerCache(self_keys, self_values, cross_keys, cross_values)

    def step(
        self, x: Tensor, cache: LayerCache, src_mask: Tensor | None, trg_mask: Tensor
    ) -> Tensor:
        """``forward`` for one new position x (B, 1, D), its values and keys read from ``cache``."""
        query = self.residual(x, lambda normed: self.attention.step(normed, cache, trg_mask))  # (B, 1, D)
        return self.transformer_block.step(cache.cross_values, cache.cross_keys, query, src_mask)
