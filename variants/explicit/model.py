"""The Transformer written out module by module, in the style of source 1.

Every module takes the one ``TransformerConfig``; attention projects with ``nn.Linear`` and
splits heads with ``.view``/``.transpose``; ``ResidualConnection`` holds the pre/post-norm toggle
and runs whatever sublayer it is handed, so each block passes its sublayers as call-site lambdas
that say what attends to what.

Shape legend:
    B  batch            S  source length     T  target length (or the query length)
    H  heads            Dh head dim          D  model dim (d_model)
    F  feed-forward dim V  vocabulary size
    t  positions decoded so far, this one included (a cached decode step's keys)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from common.activations import activation_module
from common.cache import LayerCache
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.masks import mask_scores
from common.positions import position_table
from common.probes import Probe
from common.weights import Param


class InputEmbedding(nn.Module):
    """Token ids -> vectors, scaled by sqrt(D) (section 3.4)."""

    def __init__(self, config: TransformerConfig, vocab_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, config.d_model)
        self.scale = math.sqrt(config.d_model)

    def forward(self, ids: Tensor) -> Tensor:
        return self.embedding(ids) * self.scale  # (B, S, D)


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoids of section 3.5 (or a checkpoint's layout: config.positions), then dropout."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        # float64, not saved with the weights; cast to the activations' dtype where added
        self.register_buffer("pe", position_table(config), persistent=False)  # (max_seq_len, D)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x holds positions start, start + 1, ...: one decode step passes its position t."""
        return self.dropout(x + self.pe[start : start + x.shape[1]].to(x.dtype))  # (B, S, D)


class LayerNormalization(nn.Module):
    """alpha * (x - mean) / sqrt(var + eps) + bias over the last dim, with the biased variance."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.eps = config.norm_eps
        self.alpha = nn.Parameter(torch.ones(config.d_model))  # (D,) learned gain
        self.bias = nn.Parameter(torch.zeros(config.d_model))  # (D,) learned shift

    def forward(self, x: Tensor) -> Tensor:
        # the source divides by (std + eps) with the unbiased std; the architecture's LayerNorm is
        # nn.LayerNorm's: the biased variance, eps inside the square root
        mean = x.mean(dim=-1, keepdim=True)  # (B, S, 1)
        var = x.var(dim=-1, unbiased=False, keepdim=True)  # (B, S, 1)
        return self.alpha * (x - mean) / torch.sqrt(var + self.eps) + self.bias  # (B, S, D)


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alone (section 3.3); a
    checkpoint's config.activation takes the place of max(0, ·).

    ``d_ff`` is the inner width F: config.d_ff in the encoder, config.decoder_ff_dim in the decoder.
    """

    def __init__(self, config: TransformerConfig, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(config.d_model, d_ff)  # D -> F
        self.linear2 = nn.Linear(d_ff, config.d_model)  # F -> D
        self.activation = activation_module(config)  # max(0, ·) unless config says otherwise
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (B, S, D)


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(Dh)) V in H heads, then W_o (section 3.2)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.d_model = config.d_model
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim  # d_k = D / H
        self.wq = nn.Linear(config.d_model, config.d_model)  # D -> D
        self.wk = nn.Linear(config.d_model, config.d_model)  # D -> D
        self.wv = nn.Linear(config.d_model, config.d_model)  # D -> D
        self.wo = nn.Linear(config.d_model, config.d_model)  # D -> D
        self.dropout = nn.Dropout(config.dropout)

    @staticmethod
    def attention(q: Tensor, k: Tensor, v: Tensor, dropout: nn.Module, mask: Tensor | None) -> Tensor:
        # q: (B, H, T, Dh), k and v: (B, H, S, Dh)
        d_k = q.shape[-1]
        # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
        attention_score = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T, S)
        # masked positions get the dtype's most negative value, so softmax gives them 0
        attention_score = mask_scores(attention_score, mask).softmax(dim=-1)  # (B, H, T, S)
        return dropout(attention_score) @ v  # (B, H, T, Dh)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        B, T, _ = q.shape  # q: (B, T, D)
        _, S, _ = k.shape  # k, v: (B, S, D)

        # project and split into H heads
        query = self.wq(q).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        key = self.wk(k).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        value = self.wv(v).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        x = MultiHeadAttention.attention(query, key, value, self.dropout, mask)  # (B, H, T, Dh)
        # merge heads back: (B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, D)
        x = x.transpose(1, 2).contiguous().view(B, T, self.d_model)  # (B, T, D)
        return self.wo(x)  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def step(self, x: Tensor, cache: LayerCache, mask: Tensor | None) -> Tensor:
        """Self-attention of one new position x (B, 1, D) over itself and every earlier one.

        Its key and value join the cache's (in place), so only x is projected."""
        key, value = self.keys_values(x, x)  # (B, H, 1, Dh) each
        cache.self_keys = torch.cat([cache.self_keys, key], dim=2)  # (B, H, t, Dh)
        cache.self_values = torch.cat([cache.self_values, value], dim=2)  # (B, H, t, Dh)
        return self.attend(x, cache.self_keys, cache.self_values, mask)  # (B, 1, D)

    def keys_values(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """``forward``'s keys and values: k, v (B, S, D) projected and split into heads."""
        B, S, _ = k.shape
        key = self.wk(k).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        value = self.wv(v).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        return key, value

    def attend(self, q: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> Tensor:
        """The rest of ``forward``: q (B, T, D) over keys and values already projected and
        split, (B, H, S, Dh) each."""
        B, T, _ = q.shape
        query = self.wq(q).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        x = MultiHeadAttention.attention(query, key, value, self.dropout, mask)  # (B, H, T, Dh)
        x = x.transpose(1, 2).contiguous().view(B, T, self.d_model)  # (B, T, D)
        return self.wo(x)  # (B, T, D)


class ResidualConnection(nn.Module):
    """One sublayer with its residual, dropout and LayerNorm (section 5.4).

    post-norm (the paper):  norm(x + dropout(sublayer(x)))
    pre-norm:               x + dropout(sublayer(norm(x)))

    ``sublayer`` takes the one tensor this connection hands it (x, or norm(x) in pre-norm);
    anything else it reads, such as a mask or the encoder output, the caller's lambda closes over.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.norm = LayerNormalization(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))  # (B, S, D)
        return self.norm(x + self.dropout(sublayer(x)))  # (B, S, D)


class EncoderBlock(nn.Module):
    """Self-attention, then feed-forward, each inside a residual connection."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.feed_forward = FeedForward(config, config.d_ff)
        self.self_attn_residual = ResidualConnection(config)
        self.feed_forward_residual = ResidualConnection(config)

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        # self-attention: Q = K = V = x, the encoder attends to itself
        x = self.self_attn_residual(x, lambda x: self.self_attn(x, x, x, src_mask))
        return self.feed_forward_residual(x, self.feed_forward)  # (B, S, D)


class Encoder(nn.Module):
    """N encoder blocks, then a final LayerNorm (none under config.final_norm=False)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderBlock(config) for _ in range(config.n_layers))
        self.norm = LayerNormalization(config) if config.final_norm else nn.Identity()

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)  # (B, S, D)


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.cross_attn = MultiHeadAttention(config)
        self.feed_forward = FeedForward(config, config.decoder_ff_dim)
        self.self_attn_residual = ResidualConnection(config)
        self.cross_attn_residual = ResidualConnection(config)
        self.feed_forward_residual = ResidualConnection(config)

    def forward(
        self, x: Tensor, encoder_output: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        # masked self-attention: Q = K = V = x, each position sees itself and earlier ones
        x = self.self_attn_residual(x, lambda x: self.self_attn(x, x, x, tgt_mask))
        # cross-attention: Q from the decoder, K = V = the encoder output; the residual
        # normalises only the x it hands the lambda, so pre-norm leaves the encoder output as is
        x = self.cross_attn_residual(
            x, lambda x: self.cross_attn(x, encoder_output, encoder_output, src_mask)
        )
        return self.feed_forward_residual(x, self.feed_forward)  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def start_cache(self, encoder_output: Tensor) -> LayerCache:
        """Cross-attention keys and values of the encoder output, once per source; no
        self-attention key or value yet (the projections of zero positions, (B, H, 0, Dh))."""
        cross_keys, cross_values = self.cross_attn.keys_values(encoder_output, encoder_output)
        no_position = encoder_output[:, :0]  # (B, 0, D)
        self_keys, self_values = self.self_attn.keys_values(no_position, no_position)
        return LayerCache(self_keys, self_values, cross_keys, cross_values)

    def step(
        self, x: Tensor, cache: LayerCache, src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        """``forward`` for one new position x (B, 1, D), its keys and values read from ``cache``."""
        # masked self-attention over every position so far: x's key and value join the cache
        x = self.self_attn_residual(x, lambda x: self.self_attn.step(x, cache, tgt_mask))
        # cross-attention over the encoder output's keys and values, projected once per source
        x = self.cross_attn_residual(
            x, lambda x: self.cross_attn.attend(x, cache.cross_keys, cache.cross_values, src_mask)
        )
        return self.feed_forward_residual(x, self.feed_forward)  # (B, 1, D)


class Decoder(nn.Module):
    """N decoder blocks, then a final LayerNorm (none under config.final_norm=False)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderBlock(config) for _ in range(config.n_layers))
        self.norm = LayerNormalization(config) if config.final_norm else nn.Identity()

    def forward(
        self, x: Tensor, encoder_output: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        for layer in self.layers:
            x = layer(x, encoder_output, src_mask, tgt_mask)
        return self.norm(x)  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def start_cache(self, encoder_output: Tensor) -> list[LayerCache]:
        return [layer.start_cache(encoder_output) for layer in self.layers]

    def step(
        self, x: Tensor, cache: list[LayerCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x = layer.step(x, layer_cache, src_mask, tgt_mask)
        return self.norm(x)  # (B, 1, D)


class ProjectionLayer(nn.Module):
    """Decoder output -> log-probabilities over the target vocabulary."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.linear = nn.Linear(config.d_model, config.tgt_vocab_size)  # D -> V

    def forward(self, x: Tensor) -> Tensor:
        return torch.log_softmax(self.linear(x), dim=-1)  # (B, T, V)


class Transformer(EncoderDecoder):
    """Embeddings, encoder, decoder and generator: encode -> decode -> project."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.src_embed = InputEmbedding(config, config.src_vocab_size)
        self.tgt_embed = InputEmbedding(config, config.tgt_vocab_size)
        self.src_pos = PositionalEncoding(config)
        self.tgt_pos = PositionalEncoding(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.projection = ProjectionLayer(config)
        if config.share_embeddings:  # section 3.4: one matrix, embedded twice and projected onto
            self.tgt_embed.embedding.weight = self.src_embed.embedding.weight
            self.projection.linear.weight = self.src_embed.embedding.weight

    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        x = self.src_pos(self.src_embed(src))  # (B, S, D)
        return self.encoder(x, src_mask)  # (B, S, D)

    def _decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        x = self.tgt_pos(self.tgt_embed(tgt))  # (B, T, D)
        return self.decoder(x, memory, src_mask, tgt_mask)  # (B, T, D)

    def _project(self, hidden: Tensor) -> Tensor:
        return self.projection(hidden)  # (B, T, V)

    # canonical name (docs/architecture.md) -> this variant's parameter; layouts already match nn.Linear's
    weight_map: ClassVar[dict[str, str | Param]] = {
        "src_embed.weight": "src_embed.embedding.weight",
        "tgt_embed.weight": "tgt_embed.embedding.weight",
        "{stack}.layers.{i}.self_attn.{proj}.{kind}": "{stack}.layers.{i}.self_attn.{proj}.{kind}",
        "decoder.layers.{i}.cross_attn.{proj}.{kind}": "decoder.layers.{i}.cross_attn.{proj}.{kind}",
        "{stack}.layers.{i}.ff.w1.{kind}": "{stack}.layers.{i}.feed_forward.linear1.{kind}",
        "{stack}.layers.{i}.ff.w2.{kind}": "{stack}.layers.{i}.feed_forward.linear2.{kind}",
        "{stack}.layers.{i}.norm1.weight": "{stack}.layers.{i}.self_attn_residual.norm.alpha",
        "{stack}.layers.{i}.norm1.bias": "{stack}.layers.{i}.self_attn_residual.norm.bias",
        "encoder.layers.{i}.norm2.weight": "encoder.layers.{i}.feed_forward_residual.norm.alpha",
        "encoder.layers.{i}.norm2.bias": "encoder.layers.{i}.feed_forward_residual.norm.bias",
        "decoder.layers.{i}.norm2.weight": "decoder.layers.{i}.cross_attn_residual.norm.alpha",
        "decoder.layers.{i}.norm2.bias": "decoder.layers.{i}.cross_attn_residual.norm.bias",
        "decoder.layers.{i}.norm3.weight": "decoder.layers.{i}.feed_forward_residual.norm.alpha",
        "decoder.layers.{i}.norm3.bias": "decoder.layers.{i}.feed_forward_residual.norm.bias",
        "{stack}.norm.weight": "{stack}.norm.alpha",
        "{stack}.norm.bias": "{stack}.norm.bias",
        "generator.{kind}": "projection.linear.{kind}",
    }
    # canonical point (common/probes.py) -> the module whose output it is
    probe_map: ClassVar[dict[str, str | Probe | None]] = {
        "src_embed": "src_pos",  # E[src] * sqrt(D) + PE, dropped out
        "tgt_embed": "tgt_pos",
        "{stack}.layers.{i}.self_attn": "{stack}.layers.{i}.self_attn",
        "decoder.layers.{i}.cross_attn": "decoder.layers.{i}.cross_attn",
        "{stack}.layers.{i}.ff": "{stack}.layers.{i}.feed_forward",
        "{stack}.layers.{i}.norm1": "{stack}.layers.{i}.self_attn_residual.norm",
        "encoder.layers.{i}.norm2": "encoder.layers.{i}.feed_forward_residual.norm",
        "decoder.layers.{i}.norm2": "decoder.layers.{i}.cross_attn_residual.norm",
        "decoder.layers.{i}.norm3": "decoder.layers.{i}.feed_forward_residual.norm",
        "{stack}.layers.{i}": "{stack}.layers.{i}",
        "{stack}.norm": "{stack}.norm",
        "generator": "projection",
    }

    # --- incremental decoding: the suite's addition, not the source's ---

    def _start_cache(self, memory: Tensor) -> list[LayerCache]:
        return self.decoder.start_cache(memory)

    def _decode_step(
        self, tgt: Tensor, position: int, cache: list[LayerCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        x = self.tgt_pos(self.tgt_embed(tgt), start=position)  # (B, 1, D): E[y_t] sqrt(D) + PE[t]
        return self.decoder.step(x, cache, src_mask, tgt_mask)  # (B, 1, D)
