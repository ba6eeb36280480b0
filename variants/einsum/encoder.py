"""The encoder of source 2: embeddings, positions, N TransformerBlocks, and a final LayerNorm.

Shape legend:
    B  batch            S  source length      D  model dim (d_model)
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from common.config import TransformerConfig
from common.positions import position_table
from variants.einsum.transformer_block import TransformerBlock


class Encoder(nn.Module):
    """Source ids -> enc_out: (E[ids] * sqrt(D) + PE) -> dropout -> N self-attending blocks -> norm."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.word_embedding = nn.Embedding(config.src_vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model)  # section 3.4; the source does not scale
        # fixed sinusoids (the source learns its positions); float64, not saved with the weights,
        # cast to the activations' dtype where added
        self.register_buffer("position_table", position_table(config), persistent=False)  # (max_seq_len, D)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(TransformerBlock(config, config.d_ff) for _ in range(config.n_layers))
        # the source has none; a checkpoint's config.final_norm=False has none either
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps) if config.final_norm else nn.Identity()

    def forward(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        x = self.word_embedding(src) * self.embed_scale  # (B, S, D)
        out = self.dropout(x + self.position_table[: src.shape[1]].to(x.dtype))  # (B, S, D)
        for layer in self.layers:
            out = layer(out, out, out, src_mask)  # value, key and query: self-attention
        return self.norm(out)  # (B, S, D)
