"""``torch.nn.Transformer`` in the paper's embeddings and generator: the reference row.

It computes the one architecture with PyTorch's own layers, so the from-scratch variants are
checked against code they share nothing with but the embeddings' sinusoid table.

Mask convention: the suite's masks say True = *may attend* and broadcast to
(B, H, T_query, T_key); ``nn.MultiheadAttention`` reads a bool mask as True = *blocked*, shaped
(B*H, T_query, T_key). ``_to_torch_mask`` converts at this boundary and nowhere else. A fully
masked row becomes NaN here (torch fills with -inf), where the from-scratch variants stay finite.
"""

from __future__ import annotations

import math
from typing import ClassVar

from torch import Tensor, nn

from common.activations import activation
from common.config import TransformerConfig
from common.interface import EncoderDecoder
from common.positions import position_table
from common.probes import Probe
from common.weights import Param


class Transformer(EncoderDecoder):
    """Embedding + sinusoids -> ``nn.Transformer`` (batch_first) -> Linear + log_softmax."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.src_embed = nn.Embedding(config.src_vocab_size, config.d_model)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, config.d_model)
        self.register_buffer("pe", position_table(config), persistent=False)  # (max_seq_len, D) float64
        self.dropout = nn.Dropout(config.dropout)
        # nn.Transformer takes "relu" and "gelu" by name, any activation as a function
        layer = dict(d_model=config.d_model, nhead=config.n_heads, dropout=config.dropout,
                     activation=activation(config), layer_norm_eps=config.norm_eps,
                     batch_first=True, norm_first=config.norm_first)
        encoder_layer = nn.TransformerEncoderLayer(dim_feedforward=config.d_ff, **layer)
        decoder_layer = nn.TransformerDecoderLayer(dim_feedforward=config.decoder_ff_dim, **layer)

        def final_norm() -> nn.LayerNorm | None:  # None: the stack ends at its last layer
            return nn.LayerNorm(config.d_model, eps=config.norm_eps) if config.final_norm else None

        # enable_nested_tensor=False: keep padded positions computed (not zeroed) in eval
        encoder = nn.TransformerEncoder(encoder_layer, config.n_layers, final_norm(),
                                        enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(decoder_layer, config.n_layers, final_norm())
        self.transformer = nn.Transformer(d_model=config.d_model, nhead=config.n_heads,
                                          custom_encoder=encoder, custom_decoder=decoder, batch_first=True)
        self.generator = nn.Linear(config.d_model, config.tgt_vocab_size)
        if config.share_embeddings:  # section 3.4, around nn.Transformer, which has no embeddings
            self.tgt_embed.weight = self.src_embed.weight
            self.generator.weight = self.src_embed.weight

    def _embed(self, embedding: nn.Embedding, ids: Tensor) -> Tensor:
        x = embedding(ids) * math.sqrt(self.config.d_model)
        return self.dropout(x + self.pe[: ids.shape[1]].to(x.dtype))  # (B, L, D)

    def _to_torch_mask(
        self, mask: Tensor | None, batch: int, q_len: int, k_len: int
    ) -> Tensor | None:
        """(…, T_query, T_key) True = may attend -> (B*H, T_query, T_key) True = blocked."""
        if mask is None:
            return None
        full = mask.expand(batch, self.config.n_heads, q_len, k_len)  # (B, H, T_query, T_key)
        return ~full.reshape(batch * self.config.n_heads, q_len, k_len)

    def _encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        mask = self._to_torch_mask(src_mask, *src.shape, src.shape[1])
        return self.transformer.encoder(self._embed(self.src_embed, src), mask=mask)

    def _decode(
        self, tgt: Tensor, memory: Tensor, src_mask: Tensor | None, tgt_mask: Tensor | None
    ) -> Tensor:
        (batch, tgt_len), src_len = tgt.shape, memory.shape[1]
        return self.transformer.decoder(
            self._embed(self.tgt_embed, tgt),
            memory,
            tgt_mask=self._to_torch_mask(tgt_mask, batch, tgt_len, tgt_len),
            memory_mask=self._to_torch_mask(src_mask, batch, tgt_len, src_len),
        )

    def _project(self, hidden: Tensor) -> Tensor:
        return self.generator(hidden).log_softmax(dim=-1)

    # nn.MultiheadAttention fuses W_q, W_k, W_v in in_proj_{weight,bias}: rows [0:D], [D:2D], [2D:3D]
    weight_map: ClassVar[dict[str, str | Param]] = {
        "src_embed.weight": "src_embed.weight",
        "tgt_embed.weight": "tgt_embed.weight",
        "{stack}.layers.{i}.self_attn.wq.{kind}":
            Param("transformer.{stack}.layers.{i}.self_attn.in_proj_{kind}", chunk=(0, 3)),
        "{stack}.layers.{i}.self_attn.wk.{kind}":
            Param("transformer.{stack}.layers.{i}.self_attn.in_proj_{kind}", chunk=(1, 3)),
        "{stack}.layers.{i}.self_attn.wv.{kind}":
            Param("transformer.{stack}.layers.{i}.self_attn.in_proj_{kind}", chunk=(2, 3)),
        "decoder.layers.{i}.cross_attn.wq.{kind}":
            Param("transformer.decoder.layers.{i}.multihead_attn.in_proj_{kind}", chunk=(0, 3)),
        "decoder.layers.{i}.cross_attn.wk.{kind}":
            Param("transformer.decoder.layers.{i}.multihead_attn.in_proj_{kind}", chunk=(1, 3)),
        "decoder.layers.{i}.cross_attn.wv.{kind}":
            Param("transformer.decoder.layers.{i}.multihead_attn.in_proj_{kind}", chunk=(2, 3)),
        "{stack}.layers.{i}.self_attn.wo.{kind}":
            "transformer.{stack}.layers.{i}.self_attn.out_proj.{kind}",
        "decoder.layers.{i}.cross_attn.wo.{kind}":
            "transformer.decoder.layers.{i}.multihead_attn.out_proj.{kind}",
        "{stack}.layers.{i}.ff.w1.{kind}": "transformer.{stack}.layers.{i}.linear1.{kind}",
        "{stack}.layers.{i}.ff.w2.{kind}": "transformer.{stack}.layers.{i}.linear2.{kind}",
        "{stack}.layers.{i}.{norm}.{kind}": "transformer.{stack}.layers.{i}.{norm}.{kind}",
        "{stack}.norm.{kind}": "transformer.{stack}.norm.{kind}",
        "generator.{kind}": "generator.{kind}",
    }
    # canonical point (common/probes.py) -> the module whose output it is; nn.MultiheadAttention
    # returns (output, weights), and the feed-forward's output is linear2's (it has no module)
    probe_map: ClassVar[dict[str, str | Probe | None]] = {
        "src_embed": Probe("dropout", call=0),  # one dropout after both embeddings: source first
        "tgt_embed": Probe("dropout", call=1),
        "{stack}.layers.{i}.self_attn": Probe("transformer.{stack}.layers.{i}.self_attn", item=0),
        "decoder.layers.{i}.cross_attn": Probe("transformer.decoder.layers.{i}.multihead_attn", item=0),
        "{stack}.layers.{i}.ff": "transformer.{stack}.layers.{i}.linear2",
        "{stack}.layers.{i}.norm{n}": "transformer.{stack}.layers.{i}.norm{n}",
        "{stack}.layers.{i}": "transformer.{stack}.layers.{i}",
        "{stack}.norm": "transformer.{stack}.norm",
        "generator": "",  # the generator module gives logits; log_softmax is in _project
    }
