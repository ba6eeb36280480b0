"""The decoder of source 2: embeddings, positions, N DecoderBlocks, a final LayerNorm, ``fc_out``.

Shape legend:
    B  batch            S  source length      T  target length
    D  model dim (d_model)                    V  target vocabulary size
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from common.positions import sinusoid_table
from variants.einsum.decoder_block import DecoderBlock


class Decoder(nn.Module):
    """Target ids and the encoder output -> hidden states; ``generate`` maps them to log-probabilities."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.word_embedding = nn.Embedding(config.tgt_vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model)  # section 3.4; the source does not scale
        # fixed sinusoids (the source learns its positions); float64, not saved with the weights,
        # cast to the activations' dtype where added
        self.register_buffer("position_table", sinusoid_table(config.max_seq_len, config.d_model),
                             persistent=False)  # (max_seq_len, D)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps)  # the source has none
        self.fc_out = nn.Linear(config.d_model, config.tgt_vocab_size)  # D -> V

    def forward(
        self, trg: Tensor, enc_out: Tensor, src_mask: Tensor | None, trg_mask: Tensor | None
    ) -> Tensor:
        x = self.word_embedding(trg) * self.embed_scale  # (B, T, D)
        x = self.dropout(x + self.position_table[: trg.shape[1]].to(x.dtype))  # (B, T, D)
        for layer in self.layers:
            x = layer(x, enc_out, enc_out, src_mask, trg_mask)  # value = key = the encoder output
        return self.norm(x)  # (B, T, D)

    def generate(self, hidden: Tensor) -> Tensor:
        """Hidden states -> log-probabilities over the target vocabulary (the source's fc_out)."""
        return torch.log_softmax(self.fc_out(hidden), dim=-1)  # (B, T, V)
