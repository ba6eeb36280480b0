"""The encoder-decoder Transformer assembled from the verified components of ``components.py``.

Each layer's forward reads like Figure 1 of the paper: a sublayer inside "Add & Norm",
repeated. ``weight_map`` states, next to each canonical name, the einops rearrangement
between the paper's layout used here (``x @ W``) and ``nn.Linear``'s (out, in).

Shape legend:
    B  batch            S  source length     T  target length
    H  heads            Dh head dim          D  model dim (d_model)
    F  feed-forward dim V  vocabulary size
    t  positions decoded so far, this one included (a cached decode step's keys)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from common.cache import LayerCache
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.probes import Probe
from common.weights import Param
from variants.mathfirst.components import (
    LayerNorm,
    MultiHeadAttention,
    PositionwiseFeedForward,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    xavier_uniform,
)


class AddNorm(nn.Module):
    """Add & Norm around one sublayer   (sections 3.1 and 5.4).

    post-norm (the paper):  LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm:               x + Dropout(Sublayer(LayerNorm(x)))
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.norm = LayerNorm(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))  # (B, S, D)
        return self.norm(x + self.dropout(sublayer(x)))  # (B, S, D)


class EncoderLayer(nn.Module):
    """x ← AddNorm(x, SelfAttention(x, x, x)),  x ← AddNorm(x, FFN(x))   (section 3.1)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.self_attn_add_norm = AddNorm(config)
        self.feed_forward = PositionwiseFeedForward(config, config.d_ff)
        self.feed_forward_add_norm = AddNorm(config)

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        x = self.self_attn_add_norm(x, lambda h: self.self_attn(h, h, h, src_mask))
        return self.feed_forward_add_norm(x, self.feed_forward)  # (B, S, D)


class DecoderLayer(nn.Module):
    """x ← AddNorm(x, MaskedSelfAttention(x, x, x)),  x ← AddNorm(x, Attention(x, m, m)),
    x ← AddNorm(x, FFN(x)), with m the encoder output (memory)   (section 3.1).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.self_attn_add_norm = AddNorm(config)
        self.cross_attn = MultiHeadAttention(config)
        self.cross_attn_add_norm = AddNorm(config)
        self.feed_forward = PositionwiseFeedForward(config, config.decoder_ff_dim)
        self.feed_forward_add_norm = AddNorm(config)

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        x = self.self_attn_add_norm(x, lambda h: self.self_attn(h, h, h, tgt_mask))
        # queries from the decoder, keys and values from the encoder: pre-norm normalises h only
        x = self.cross_attn_add_norm(x, lambda h: self.cross_attn(h, memory, memory, src_mask))
        return self.feed_forward_add_norm(x, self.feed_forward)  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def start_cache(self, memory: Tensor) -> LayerCache:
        """The cross-attention's m W_k^h + b_k^h and m W_v^h + b_v^h, once per source, and
        K_{1:0}, V_{1:0}: the self-attention's keys and values of no position, (B, H, 0, Dh)."""
        K_m, V_m = self.cross_attn.keys_values(memory, memory)  # (B, H, S, Dh) each
        K_0, V_0 = self.self_attn.keys_values(memory[:, :0], memory[:, :0])  # (B, H, 0, Dh) each
        return LayerCache(K_0, V_0, K_m, V_m)

    def step(
        self, x_t: Tensor, cache: LayerCache, src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        """The layer at position t alone, x_t (B, 1, D): its self-attention reads K_{1:t-1},
        V_{1:t-1} from ``cache`` and appends x_t's; its cross-attention reads m's keys and values."""
        x_t = self.self_attn_add_norm(x_t, lambda h: self.self_attn.step(h, cache, tgt_mask))
        x_t = self.cross_attn_add_norm(
            x_t, lambda h: self.cross_attn.attend(h, cache.cross_keys, cache.cross_values, src_mask)
        )
        return self.feed_forward_add_norm(x_t, self.feed_forward)  # (B, 1, D)


class Encoder(nn.Module):
    """N encoder layers, then a final LayerNorm (as torch.nn.Transformer, in both modes; none
    under config.final_norm=False)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layers))
        self.norm = LayerNorm(config) if config.final_norm else nn.Identity()

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)  # (B, S, D)


class Decoder(nn.Module):
    """N decoder layers, then a final LayerNorm (as torch.nn.Transformer, in both modes; none
    under config.final_norm=False)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        self.norm = LayerNorm(config) if config.final_norm else nn.Identity()

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def start_cache(self, memory: Tensor) -> list[LayerCache]:
        return [layer.start_cache(memory) for layer in self.layers]

    def step(
        self, x_t: Tensor, cache: list[LayerCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x_t = layer.step(x_t, layer_cache, src_mask, tgt_mask)
        return self.norm(x_t)  # (B, 1, D)


class Generator(nn.Module):
    """log softmax(x W + b): next-token log-probabilities   (section 3.4).

    Given the embeddings' E (shared embeddings), W = Eᵀ: the generator reads E and owns only b.
    """

    def __init__(self, config: TransformerConfig, E: nn.Parameter | None = None) -> None:
        super().__init__()
        D, V = config.d_model, config.tgt_vocab_size
        self.shares_E = E is not None
        if self.shares_E:
            self.E = E  # (V, D), the embedding matrix itself
        else:
            self.W = xavier_uniform(D, V, fan_in=D, fan_out=V)  # (D, V)
        self.b = nn.Parameter(torch.zeros(V))  # (V,)

    def forward(self, x: Tensor) -> Tensor:
        W = self.E.T if self.shares_E else self.W  # (D, V)
        return torch.log_softmax(x @ W + self.b, dim=-1)  # (B, T, V)


class Transformer(EncoderDecoder):
    """Embed + positions -> encoder -> decoder -> generator: encode, decode, project."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        shared = config.share_embeddings  # section 3.4: one E, used as E[src], E[tgt] and W = Eᵀ
        self.src_embedding = TokenEmbedding(config, config.src_vocab_size)
        self.tgt_embedding = self.src_embedding if shared else TokenEmbedding(config, config.tgt_vocab_size)
        self.positional_encoding = SinusoidalPositionalEncoding(config)  # no weights: one serves both
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.generator = Generator(config, E=self.src_embedding.E if shared else None)

    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        x = self.positional_encoding(self.src_embedding(src))  # (B, S, D)
        return self.encoder(x, src_mask)  # (B, S, D)

    def _decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        x = self.positional_encoding(self.tgt_embedding(tgt))  # (B, T, D)
        return self.decoder(x, memory, src_mask, tgt_mask)  # (B, T, D)

    def _project(self, hidden: Tensor) -> Tensor:
        return self.generator(hidden)  # (B, T, V)

    # canonical name (docs/architecture.md) -> this variant's parameter; W is applied as x @ W, so each layout
    # turns it into nn.Linear's (out, in): h head, k head dim, d model, f feed-forward, v vocabulary
    weight_map: ClassVar[dict[str, str | Param]] = {
        "src_embed.weight": "src_embedding.E",
        "tgt_embed.weight": "tgt_embedding.E",
        "{stack}.layers.{i}.{attn}.wq.weight":
            Param("{stack}.layers.{i}.{attn}.W_q", layout="h d k -> (h k) d"),
        "{stack}.layers.{i}.{attn}.wk.weight":
            Param("{stack}.layers.{i}.{attn}.W_k", layout="h d k -> (h k) d"),
        "{stack}.layers.{i}.{attn}.wv.weight":
            Param("{stack}.layers.{i}.{attn}.W_v", layout="h d k -> (h k) d"),
        "{stack}.layers.{i}.{attn}.wo.weight":
            Param("{stack}.layers.{i}.{attn}.W_o", layout="h k d -> d (h k)"),
        "{stack}.layers.{i}.{attn}.wq.bias":
            Param("{stack}.layers.{i}.{attn}.b_q", layout="h k -> (h k)"),
        "{stack}.layers.{i}.{attn}.wk.bias":
            Param("{stack}.layers.{i}.{attn}.b_k", layout="h k -> (h k)"),
        "{stack}.layers.{i}.{attn}.wv.bias":
            Param("{stack}.layers.{i}.{attn}.b_v", layout="h k -> (h k)"),
        "{stack}.layers.{i}.{attn}.wo.bias": "{stack}.layers.{i}.{attn}.b_o",
        "{stack}.layers.{i}.ff.w1.weight": Param("{stack}.layers.{i}.feed_forward.W_1", layout="d f -> f d"),
        "{stack}.layers.{i}.ff.w1.bias": "{stack}.layers.{i}.feed_forward.b_1",
        "{stack}.layers.{i}.ff.w2.weight": Param("{stack}.layers.{i}.feed_forward.W_2", layout="f d -> d f"),
        "{stack}.layers.{i}.ff.w2.bias": "{stack}.layers.{i}.feed_forward.b_2",
        "{stack}.layers.{i}.norm1.weight": "{stack}.layers.{i}.self_attn_add_norm.norm.gamma",
        "{stack}.layers.{i}.norm1.bias": "{stack}.layers.{i}.self_attn_add_norm.norm.beta",
        "encoder.layers.{i}.norm2.weight": "encoder.layers.{i}.feed_forward_add_norm.norm.gamma",
        "encoder.layers.{i}.norm2.bias": "encoder.layers.{i}.feed_forward_add_norm.norm.beta",
        "decoder.layers.{i}.norm2.weight": "decoder.layers.{i}.cross_attn_add_norm.norm.gamma",
        "decoder.layers.{i}.norm2.bias": "decoder.layers.{i}.cross_attn_add_norm.norm.beta",
        "decoder.layers.{i}.norm3.weight": "decoder.layers.{i}.feed_forward_add_norm.norm.gamma",
        "decoder.layers.{i}.norm3.bias": "decoder.layers.{i}.feed_forward_add_norm.norm.beta",
        "{stack}.norm.weight": "{stack}.norm.gamma",
        "{stack}.norm.bias": "{stack}.norm.beta",
        "generator.weight": Param("generator.W", layout="d v -> v d"),
        "generator.bias": "generator.b",
    }
    # with shared embeddings the generator holds E itself, (V, D) as the canonical weight
    tied_weight_map: ClassVar[dict[str, str | Param]] = {"generator.weight": "generator.E"}
    # canonical point (common/probes.py) -> the module whose output it is
    probe_map: ClassVar[dict[str, str | Probe | None]] = {
        "src_embed": Probe("positional_encoding", call=0),  # one module for both: the source first
        "tgt_embed": Probe("positional_encoding", call=1),
        "{stack}.layers.{i}.self_attn": "{stack}.layers.{i}.self_attn",
        "decoder.layers.{i}.cross_attn": "decoder.layers.{i}.cross_attn",
        "{stack}.layers.{i}.ff": "{stack}.layers.{i}.feed_forward",
        "{stack}.layers.{i}.norm1": "{stack}.layers.{i}.self_attn_add_norm.norm",
        "encoder.layers.{i}.norm2": "encoder.layers.{i}.feed_forward_add_norm.norm",
        "decoder.layers.{i}.norm2": "decoder.layers.{i}.cross_attn_add_norm.norm",
        "decoder.layers.{i}.norm3": "decoder.layers.{i}.feed_forward_add_norm.norm",
        "{stack}.layers.{i}": "{stack}.layers.{i}",
        "{stack}.norm": "{stack}.norm",
        "generator": "generator",
    }

    # --- incremental decoding: the suite's addition, not the source's ---

    def _start_cache(self, memory: Tensor) -> list[LayerCache]:
        return self.decoder.start_cache(memory)

    def _decode_step(
        self, tgt: Tensor, position: int, cache: list[LayerCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        x_t = self.positional_encoding(self.tgt_embedding(tgt), start=position)  # E[y_t]·√D + PE[t]
        return self.decoder.step(x_t, cache, src_mask, tgt_mask)  # (B, 1, D)
