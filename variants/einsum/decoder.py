"""The decoder of source 2: embeddings, positions, N DecoderBlocks, a final LayerNorm, ``fc_out``.

Shape legend:
    B  batch            S  source length      T  target length
    D  model dim (d_model)                    V  target vocabulary size
    t  positions decoded so far, this one included (a cached decode step's keys)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from common.cache import LayerCache
from common.config import TransformerConfig
from common.positions import position_table
from variants.einsum.decoder_block import DecoderBlock


class Decoder(nn.Module):
    """Target ids and the encoder output -> hidden states; ``generate`` maps them to log-probabilities."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.word_embedding = nn.Embedding(config.tgt_vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model)  # section 3.4; the source does not scale
        # fixed sinusoids (the source learns its positions); float64, not saved with the weights,
        # cast to the activations' dtype where added
        self.register_buffer("position_table", position_table(config), persistent=False)  # (max_seq_len, D)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        # the source has none; a checkpoint's config.final_norm=False has none either
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps) if config.final_norm else nn.Identity()
        self.fc_out = nn.Linear(config.d_model, config.tgt_vocab_size)  # D -> V

    def forward(
        self, trg: Tensor, enc_out: Tensor, src_mask: Tensor | None, trg_mask: Tensor | None
    ) -> Tensor:
        x = self.embed(trg)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, enc_out, enc_out, src_mask, trg_mask)  # value = key = the encoder output
        return self.norm(x)  # (B, T, D)

    def embed(self, trg: Tensor, start: int = 0) -> Tensor:
        """Word embeddings plus the positions start, start + 1, ... (a decode step's is t)."""
        x = self.word_embedding(trg) * self.embed_scale  # (B, T, D)
        return self.dropout(x + self.position_table[start : start + trg.shape[1]].to(x.dtype))  # (B, T, D)

    def generate(self, hidden: Tensor) -> Tensor:
        """Hidden states -> log-probabilities over the target vocabulary (the source's fc_out)."""
        return torch.log_softmax(self.fc_out(hidden), dim=-1)  # (B, T, V)

    # --- incremental decoding: the suite's addition, not the source's ---

    def start_cache(self, enc_out: Tensor) -> list[LayerCache]:
        return [layer.start_cache(enc_out) for layer in self.layers]

    def step(
        self, trg: Tensor, position: int, cache: list[LayerCache], src_mask: Tensor | None,
        trg_mask: Tensor,
    ) -> Tensor:
        """(B, 1) ids at ``position`` -> (B, 1, D), reading and growing each layer's cache."""
        x = self.embed(trg, start=position)  # (B, 1, D)
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x = layer.step(x, layer_cache, src_mask, trg_mask)
        return self.norm(x)  # (B, 1, D)
