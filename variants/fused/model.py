"""The Transformer as a current PyTorch codebase writes it: fused projections and fused kernels.

Self-attention projects Q, K and V with one ``nn.Linear(D, 3D)`` and cross-attention K and V
with one ``nn.Linear(D, 2D)``; attention itself is one ``F.scaled_dot_product_attention``
call, with the dropout on its weights; LayerNorm is ``nn.LayerNorm`` (``F.layer_norm``). The
attention is nanoGPT's; the layers are ``nn.TransformerEncoderLayer``'s, pre/post-norm inline.

Mask convention: the suite's masks say True = *may attend*; ``sdpa_mask`` turns one into SDPA's
additive mask once per stack, keeping the from-scratch variants' fully masked rows (below).

Incremental decoding (``start_cache`` and ``step``, the suite's addition) sits below each class's
forward path; its cache keeps keys and values with the heads merged, (B, t, D), as projected.

fused's static-shape step (``variants/fused/static.py``, for ``torch.compile``) meets this file
only at the layer cache's ``add``: a growing cache appends keys and values, a static one writes.

The ``export_*`` stages are the four stages unchecked, for the ONNX exporter to trace
(``seq2seq.deploy.onnx_runtime``), which checks its inputs at its own boundary.

Shape legend:
    B  batch            S  source length     T  target length (or the query length)
    H  heads            Dh head dim          D  model dim (d_model)
    F  feed-forward dim V  vocabulary size
    t  positions decoded so far, this one included (a cached decode step's keys)
    R  a cached step's rows: B·k, k rows (beams) per source in fused's static beam cache
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.activations import activation
from common.cache import LayerCache
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.positions import position_table
from common.probes import Probe
from common.weights import Param
from variants.fused.static import StaticDecoding


class SdpaMask(NamedTuple):
    """A suite mask as ``F.scaled_dot_product_attention`` takes it, built once per stack."""

    additive: Tensor  # (B, H, T_query, T_key) or 1s: 0 where a query may attend, -inf where not
    no_key: Tensor  # (B, H, T_query, 1) or 1s: True where the suite's mask leaves a query no key


def sdpa_mask(mask: Tensor | None, dtype: torch.dtype) -> SdpaMask | None:
    """The suite's bool mask (True = may attend) -> SDPA's additive mask, fully masked rows kept.

    The from-scratch variants fill blocked scores with finfo(dtype).min, so a query whose every
    key is blocked scores them all equally and attends uniformly to every key: its output is
    the mean of V, and Q and K get no gradient from it. A mask alone cannot give SDPA that: a
    bool or -inf row comes out 0 or NaN; an added finfo.min passes Q and K a gradient, and does
    not even swamp the scores where the kernel accumulates in a wider type (float16 on CPU adds
    -65504 in float32). So such a row is opened to every key here, and ``Attention.attend``
    zeroes its query: every score is then exactly 0 in any kernel and dtype, the row is the
    same uniform softmax, and the zeroed query passes nothing back to Q or K.
    """
    if mask is None:
        return None
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # 4-d, as SDPA's kernels want
    no_key = ~mask.any(dim=-1, keepdim=True)  # (B | 1, H | 1, T_query | 1, 1)
    blocked = ~(mask | no_key)  # no row is blocked everywhere, so no row is all -inf
    additive = torch.zeros(blocked.shape, dtype=dtype, device=mask.device)
    return SdpaMask(additive.masked_fill(blocked, -math.inf), no_key)


@dataclass
class GrowingCache(LayerCache):
    """A ``LayerCache`` whose self-attention keys and values grow by one position a step."""

    def add(self, k: Tensor, v: Tensor) -> None:
        """Append one position's key and value, (B, 1, D) each."""
        self.self_keys = torch.cat([self.self_keys, k], dim=1)  # (B, t, D)
        self.self_values = torch.cat([self.self_values, v], dim=1)  # (B, t, D)


class Attention(nn.Module):
    """softmax(Q K^T / sqrt(Dh)) V in H heads, then W_o (section 3.2), as one SDPA call.

    Subclasses project Q, K and V; this splits the heads, attends and merges them.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.d_model = config.d_model
        self.n_heads = config.n_heads
        self.dropout_p = config.dropout  # a probability, not a module: SDPA drops attention weights
        self.out_proj = nn.Linear(config.d_model, config.d_model)  # W_o

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: SdpaMask | None) -> Tensor:
        batch, q_len, _ = q.shape
        q = q.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, H, T, Dh)
        k = k.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, H, S, Dh)
        v = v.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, H, S, Dh)
        dropout_p = self.dropout_p if self.training else 0.0  # in training only
        if mask is None:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)  # (B, H, T, Dh)
        else:
            q = q.masked_fill(mask.no_key, 0.0)  # a query with no key scores every key 0
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.additive, dropout_p=dropout_p)
        x = x.transpose(1, 2).reshape(batch, q_len, self.d_model)  # (B, T, D)
        return self.out_proj(x)  # (B, T, D)


class SelfAttention(Attention):
    """Q, K and V from one projection of x: rows [W_q; W_k; W_v] of ``qkv_proj``."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.qkv_proj = nn.Linear(config.d_model, 3 * config.d_model)  # D -> 3D

    def forward(self, x: Tensor, mask: SdpaMask | None) -> Tensor:
        q, k, v = self.qkv_proj(x).split(self.d_model, dim=-1)  # 3 x (B, T, D)
        return self.attend(q, k, v, mask)  # (B, T, D)

    # --- incremental decoding: the suite's addition ---

    def empty_keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values of zero positions, (B, 0, D) each: a cache's start. Projected, not
        built, so they come in the dtype the projection gives (autocast's, under autocast)."""
        _, k, v = self.qkv_proj(memory[:, :0]).split(self.d_model, dim=-1)  # 3 x (B, 0, D)
        return k, v

    def step(self, x: Tensor, cache: GrowingCache, mask: SdpaMask | None) -> Tensor:
        """``forward`` for one new position x (B, 1, D) over every position so far: its key and
        value are added to the cache's (in place), so only x is projected."""
        q, k, v = self.qkv_proj(x).split(self.d_model, dim=-1)  # 3 x (B, 1, D)
        cache.add(k, v)
        return self.attend(q, cache.self_keys, cache.self_values, mask)  # (B, 1, D)


class CrossAttention(Attention):
    """Q from the decoder; K and V from one projection of the encoder output: rows [W_k; W_v]."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        self.q_proj = nn.Linear(config.d_model, config.d_model)  # D -> D
        self.kv_proj = nn.Linear(config.d_model, 2 * config.d_model)  # D -> 2D

    def forward(self, x: Tensor, memory: Tensor, mask: SdpaMask | None) -> Tensor:
        k, v = self.keys_values(memory)  # 2 x (B, S, D)
        return self.attend(self.q_proj(x), k, v, mask)  # (B, T, D)

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.kv_proj(memory).split(self.d_model, dim=-1)  # 2 x (B, S, D)
        return k, v

    # --- incremental decoding: the suite's addition ---

    def step(self, x: Tensor, cache: LayerCache, mask: SdpaMask | None) -> Tensor:
        """``forward`` for one new position x (R, 1, D), over the encoder output's keys and values
        in ``cache`` (B, S, D), projected once per source when the cache started. R = B·k: the k
        rows of a source (its beams; k = 1 but in a static beam cache) attend to the same keys,
        so they go in as k queries of the source's one row."""
        rows, sources = x.shape[0], cache.cross_keys.shape[0]
        q = self.q_proj(x).view(sources, rows // sources, self.d_model)  # (B, k, D)
        x = self.attend(q, cache.cross_keys, cache.cross_values, mask)  # (B, k, D)
        return x.view(rows, 1, self.d_model)  # (R, 1, D)


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, applied to each position alone (section 3.3); act is
    config.activation (ReLU in the paper), the inner width d_ff the encoder's or the decoder's."""

    def __init__(self, config: TransformerConfig, d_ff: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(config.d_model, d_ff)  # D -> F
        self.linear2 = nn.Linear(d_ff, config.d_model)  # F -> D
        self.activation = activation(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (B, S, D)


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward; each with dropout, residual and LayerNorm (sec. 5.4)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = SelfAttention(config)
        self.feed_forward = FeedForward(config, config.d_ff)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.dropout = nn.Dropout(config.dropout)  # on each sublayer's output

    def forward(self, x: Tensor, mask: SdpaMask | None) -> Tensor:
        if self.norm_first:  # pre-norm: x + dropout(sublayer(norm(x)))
            x = x + self.dropout(self.self_attn(self.norm1(x), mask))
            return x + self.dropout(self.feed_forward(self.norm2(x)))
        # post-norm (the paper): norm(x + dropout(sublayer(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, mask)))
        return self.norm2(x + self.dropout(self.feed_forward(x)))  # (B, S, D)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.self_attn = SelfAttention(config)
        self.cross_attn = CrossAttention(config)
        self.feed_forward = FeedForward(config, config.decoder_ff_dim)
        self.norm1 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.norm2 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.norm3 = nn.LayerNorm(config.d_model, eps=config.norm_eps)
        self.dropout = nn.Dropout(config.dropout)  # on each sublayer's output

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: SdpaMask | None, tgt_mask: SdpaMask | None
    ) -> Tensor:
        if self.norm_first:  # pre-norm; cross-attention normalises the query, never the memory
            x = x + self.dropout(self.self_attn(self.norm1(x), tgt_mask))
            x = x + self.dropout(self.cross_attn(self.norm2(x), memory, src_mask))
            return x + self.dropout(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout(self.self_attn(x, tgt_mask)))
        x = self.norm2(x + self.dropout(self.cross_attn(x, memory, src_mask)))
        return self.norm3(x + self.dropout(self.feed_forward(x)))  # (B, T, D)

    # --- incremental decoding: the suite's addition ---

    def start_cache(self, memory: Tensor) -> GrowingCache:
        """The encoder output's keys and values, once per source, and no self-attention key or
        value yet. Kept with the heads merged, (B, S, D) and (B, 0, D), as projected."""
        return GrowingCache(*self.self_attn.empty_keys_values(memory), *self.cross_attn.keys_values(memory))

    def step(
        self, x: Tensor, cache: GrowingCache, src_mask: SdpaMask | None, tgt_mask: SdpaMask | None
    ) -> Tensor:
        """``forward`` for one new position x (B, 1, D), the attentions reading and growing ``cache``."""
        if self.norm_first:
            x = x + self.dropout(self.self_attn.step(self.norm1(x), cache, tgt_mask))
            x = x + self.dropout(self.cross_attn.step(self.norm2(x), cache, src_mask))
            return x + self.dropout(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout(self.self_attn.step(x, cache, tgt_mask)))
        x = self.norm2(x + self.dropout(self.cross_attn.step(x, cache, src_mask)))
        return self.norm3(x + self.dropout(self.feed_forward(x)))  # (B, 1, D)


class Encoder(nn.Module):
    """N encoder layers, then a final LayerNorm (none under config.final_norm=False)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps) if config.final_norm else nn.Identity()

    def forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        mask = sdpa_mask(src_mask, x.dtype)  # once for every layer
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)  # (B, S, D)


class Decoder(nn.Module):
    """N decoder layers, then a final LayerNorm (none under config.final_norm=False)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps) if config.final_norm else nn.Identity()

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        src, tgt = sdpa_mask(src_mask, x.dtype), sdpa_mask(tgt_mask, x.dtype)  # once for every layer
        for layer in self.layers:
            x = layer(x, memory, src, tgt)
        return self.norm(x)  # (B, T, D)

    # --- incremental decoding: the suite's addition ---

    def start_cache(self, memory: Tensor) -> list[GrowingCache]:
        return [layer.start_cache(memory) for layer in self.layers]

    def step(
        self, x: Tensor, cache: list[LayerCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        src, tgt = sdpa_mask(src_mask, x.dtype), sdpa_mask(tgt_mask, x.dtype)  # once for every layer
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x = layer.step(x, layer_cache, src, tgt)
        return self.norm(x)  # (B, 1, D)


class Transformer(StaticDecoding, EncoderDecoder):
    """Embeddings + sinusoids, encoder, decoder and generator: encode -> decode -> project."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.src_embed = nn.Embedding(config.src_vocab_size, config.d_model)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, config.d_model)
        # float64, not saved with the weights; cast to the activations' dtype where added
        self.register_buffer("pe", position_table(config), persistent=False)  # (max_seq_len, D)
        self.dropout = nn.Dropout(config.dropout)  # on embeddings + positions
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.generator = nn.Linear(config.d_model, config.tgt_vocab_size)  # D -> V
        if config.share_embeddings:  # weight tying (section 3.4), as nanoGPT ties wte and lm_head
            self.src_embed.weight = self.tgt_embed.weight = self.generator.weight

    def _embed(self, embedding: nn.Embedding, ids: Tensor, start: int = 0) -> Tensor:
        """E[ids] * sqrt(D) + PE[start:start + L], then dropout (sections 3.4 and 3.5)."""
        return self._embed_at(embedding, ids, self.pe[start : start + ids.shape[1]])  # (B, L, D)

    def _embed_at(self, embedding: nn.Embedding, ids: Tensor, positions: Tensor) -> Tensor:
        """E[ids] * sqrt(D) + ``positions`` (L, D), rows of PE, then dropout."""
        x = embedding(ids) * math.sqrt(self.config.d_model)
        return self.dropout(x + positions.to(x.dtype))  # (B, L, D)

    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        return self.encoder(self._embed(self.src_embed, src), src_mask)  # (B, S, D)

    def _decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        return self.decoder(self._embed(self.tgt_embed, tgt), memory, src_mask, tgt_mask)  # (B, T, D)

    def _project(self, hidden: Tensor) -> Tensor:
        return F.log_softmax(self.generator(hidden), dim=-1)  # (B, T, V)

    # canonical name (docs/architecture.md) -> this variant's parameter. The fused projections hold the
    # canonical matrices as row blocks: qkv_proj = [W_q; W_k; W_v], kv_proj = [W_k; W_v].
    weight_map: ClassVar[dict[str, str | Param]] = {
        "src_embed.weight": "src_embed.weight",
        "tgt_embed.weight": "tgt_embed.weight",
        "{stack}.layers.{i}.self_attn.wq.{kind}":
            Param("{stack}.layers.{i}.self_attn.qkv_proj.{kind}", chunk=(0, 3)),
        "{stack}.layers.{i}.self_attn.wk.{kind}":
            Param("{stack}.layers.{i}.self_attn.qkv_proj.{kind}", chunk=(1, 3)),
        "{stack}.layers.{i}.self_attn.wv.{kind}":
            Param("{stack}.layers.{i}.self_attn.qkv_proj.{kind}", chunk=(2, 3)),
        "decoder.layers.{i}.cross_attn.wq.{kind}": "decoder.layers.{i}.cross_attn.q_proj.{kind}",
        "decoder.layers.{i}.cross_attn.wk.{kind}":
            Param("decoder.layers.{i}.cross_attn.kv_proj.{kind}", chunk=(0, 2)),
        "decoder.layers.{i}.cross_attn.wv.{kind}":
            Param("decoder.layers.{i}.cross_attn.kv_proj.{kind}", chunk=(1, 2)),
        "{stack}.layers.{i}.{attn}.wo.{kind}": "{stack}.layers.{i}.{attn}.out_proj.{kind}",
        "{stack}.layers.{i}.ff.w1.{kind}": "{stack}.layers.{i}.feed_forward.linear1.{kind}",
        "{stack}.layers.{i}.ff.w2.{kind}": "{stack}.layers.{i}.feed_forward.linear2.{kind}",
        "{stack}.layers.{i}.{norm}.{kind}": "{stack}.layers.{i}.{norm}.{kind}",
        "{stack}.norm.{kind}": "{stack}.norm.{kind}",
        "generator.{kind}": "generator.{kind}",
    }
    # canonical point (common/probes.py) -> the module whose output it is
    probe_map: ClassVar[dict[str, str | Probe | None]] = {
        "src_embed": Probe("dropout", call=0),  # one dropout after both embeddings: source first
        "tgt_embed": Probe("dropout", call=1),
        "{stack}.layers.{i}.self_attn": "{stack}.layers.{i}.self_attn",
        "decoder.layers.{i}.cross_attn": "decoder.layers.{i}.cross_attn",
        "{stack}.layers.{i}.ff": "{stack}.layers.{i}.feed_forward",
        "{stack}.layers.{i}.norm{n}": "{stack}.layers.{i}.norm{n}",
        "{stack}.layers.{i}": "{stack}.layers.{i}",
        "{stack}.norm": "{stack}.norm",
        "generator": "",  # the generator module gives logits; log_softmax is in _project
    }

    # --- incremental decoding: the suite's addition ---

    def _start_cache(self, memory: Tensor) -> list[GrowingCache]:
        return self.decoder.start_cache(memory)

    def _decode_step(
        self, tgt: Tensor, position: int, cache: list[GrowingCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        x = self._embed(self.tgt_embed, tgt, start=position)  # (B, 1, D)
        return self.decoder.step(x, cache, src_mask, tgt_mask)  # (B, 1, D)

    # --- export stages: the stages unchecked, for the ONNX exporter to trace ---

    def export_encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        return self._encode(src, src_mask)  # (B, S, D)

    def export_start_cache(self, memory: Tensor) -> list[GrowingCache]:
        return self._start_cache(memory)

    def export_decode_step(
        self, tgt: Tensor, position: int, cache: list[GrowingCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        return self._decode_step(tgt, position, cache, src_mask, tgt_mask)  # (B, 1, D)

    def export_project(self, hidden: Tensor) -> Tensor:
        return self._project(hidden)  # (B, T, V)

    @staticmethod
    def export_layer_cache(self_keys: Tensor, self_values: Tensor, cross_keys: Tensor,
                           cross_values: Tensor) -> GrowingCache:
        """One decoder layer's cache from its four tensors, (B, t, D) and (B, S, D)."""
        return GrowingCache(self_keys, self_values, cross_keys, cross_values)
