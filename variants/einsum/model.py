"""The whole Transformer of source 2: an Encoder and a Decoder, plus the masks they read.

Composition, bottom up (one class per module, each built only from the one beneath)::

    SelfAttention
        └── TransformerBlock ──────────────┐
                ├── Encoder                │
                └── DecoderBlock ──────────┤
                        └── Decoder        │
                                └── Transformer

Shape legend:
    B  batch            S  source length      T  target length
    H  heads            Dh head dim           D  model dim (d_model)
    V  target vocabulary size
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from common.cache import LayerCache
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.masks import decoder_mask, padding_mask
from common.probes import Probe
from common.weights import Param
from variants.einsum.decoder import Decoder
from variants.einsum.encoder import Encoder


class Transformer(EncoderDecoder):
    """Encoder and decoder: encode -> decode -> project."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        if config.share_embeddings:  # section 3.4: the encoder's word embedding is used three times
            self.decoder.word_embedding.weight = self.encoder.word_embedding.weight
            self.decoder.fc_out.weight = self.encoder.word_embedding.weight

    # The source's mask builders, kept as its public API. Its forward(src, trg) built the masks
    # itself; the shared interface takes them from the caller, so nothing in this suite calls
    # these. A caller of this model alone writes
    # ``model(src, trg, model.make_src_mask(src), model.make_trg_mask(trg))``.
    def make_src_mask(self, src: Tensor) -> Tensor:
        """(B, S) source ids -> (B, 1, 1, S): True at real tokens."""
        return padding_mask(src, self.config.pad_id)

    def make_trg_mask(self, trg: Tensor) -> Tensor:
        """(B, T) target ids -> (B, 1, T, T): causal, and blind to target padding."""
        return decoder_mask(trg, self.config.pad_id)

    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        return self.encoder(src, src_mask)  # (B, S, D)

    def _decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        return self.decoder(tgt, memory, src_mask, tgt_mask)  # (B, T, D)

    def _project(self, hidden: Tensor) -> Tensor:
        return self.decoder.generate(hidden)  # (B, T, V)

    # canonical name (docs/architecture.md) -> this variant's parameter; layouts already match nn.Linear's;
    # the decoder's cross-attention, ff, norm2 and norm3 live in its transformer_block
    weight_map: ClassVar[dict[str, str | Param]] = {
        "src_embed.weight": "encoder.word_embedding.weight",
        "tgt_embed.weight": "decoder.word_embedding.weight",
        "{stack}.layers.{i}.self_attn.wq.{kind}": "{stack}.layers.{i}.attention.queries.{kind}",
        "{stack}.layers.{i}.self_attn.wk.{kind}": "{stack}.layers.{i}.attention.keys.{kind}",
        "{stack}.layers.{i}.self_attn.wv.{kind}": "{stack}.layers.{i}.attention.values.{kind}",
        "{stack}.layers.{i}.self_attn.wo.{kind}": "{stack}.layers.{i}.attention.fc_out.{kind}",
        "decoder.layers.{i}.cross_attn.wq.{kind}":
            "decoder.layers.{i}.transformer_block.attention.queries.{kind}",
        "decoder.layers.{i}.cross_attn.wk.{kind}":
            "decoder.layers.{i}.transformer_block.attention.keys.{kind}",
        "decoder.layers.{i}.cross_attn.wv.{kind}":
            "decoder.layers.{i}.transformer_block.attention.values.{kind}",
        "decoder.layers.{i}.cross_attn.wo.{kind}":
            "decoder.layers.{i}.transformer_block.attention.fc_out.{kind}",
        "encoder.layers.{i}.ff.w1.{kind}": "encoder.layers.{i}.feed_forward.linear1.{kind}",
        "encoder.layers.{i}.ff.w2.{kind}": "encoder.layers.{i}.feed_forward.linear2.{kind}",
        "decoder.layers.{i}.ff.w1.{kind}":
            "decoder.layers.{i}.transformer_block.feed_forward.linear1.{kind}",
        "decoder.layers.{i}.ff.w2.{kind}":
            "decoder.layers.{i}.transformer_block.feed_forward.linear2.{kind}",
        "encoder.layers.{i}.{norm}.{kind}": "encoder.layers.{i}.{norm}.{kind}",
        "decoder.layers.{i}.norm1.{kind}": "decoder.layers.{i}.norm.{kind}",
        "decoder.layers.{i}.norm2.{kind}": "decoder.layers.{i}.transformer_block.norm1.{kind}",
        "decoder.layers.{i}.norm3.{kind}": "decoder.layers.{i}.transformer_block.norm2.{kind}",
        "{stack}.norm.{kind}": "{stack}.norm.{kind}",
        "generator.{kind}": "decoder.fc_out.{kind}",
    }
    # canonical point (common/probes.py) -> the module whose output it is
    probe_map: ClassVar[dict[str, str | Probe | None]] = {
        "src_embed": "encoder.dropout",  # after E[src] * sqrt(D) + PE
        "tgt_embed": "decoder.dropout",
        "{stack}.layers.{i}.self_attn": "{stack}.layers.{i}.attention",
        "decoder.layers.{i}.cross_attn": "decoder.layers.{i}.transformer_block.attention",
        "encoder.layers.{i}.ff": "encoder.layers.{i}.feed_forward",
        "decoder.layers.{i}.ff": "decoder.layers.{i}.transformer_block.feed_forward",
        "encoder.layers.{i}.norm{n}": "encoder.layers.{i}.norm{n}",
        "decoder.layers.{i}.norm1": "decoder.layers.{i}.norm",
        "decoder.layers.{i}.norm2": "decoder.layers.{i}.transformer_block.norm1",
        "decoder.layers.{i}.norm3": "decoder.layers.{i}.transformer_block.norm2",
        "{stack}.layers.{i}": "{stack}.layers.{i}",
        "{stack}.norm": "{stack}.norm",
        "generator": "",  # decoder.generate is a method, not a module: the model's own output
    }

    # --- incremental decoding: the suite's addition, not the source's ---

    def _start_cache(self, memory: Tensor) -> list[LayerCache]:
        return self.decoder.start_cache(memory)

    def _decode_step(
        self, tgt: Tensor, position: int, cache: list[LayerCache], src_mask: Tensor | None, tgt_mask: Tensor
    ) -> Tensor:
        return self.decoder.step(tgt, position, cache, src_mask, tgt_mask)  # (B, 1, D)
