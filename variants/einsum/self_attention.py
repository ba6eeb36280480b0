"""Multi-head attention written with ``torch.einsum``, in the style of source 2.

Shape legend:
    B  batch            S  source length (the key/value length)
    T  target length (the query length)
    H  heads            Dh head dim          D  model dim (d_model)

einsum letters, as in the source: n = B, q = query positions, k = l = key positions,
h = H, d = Dh.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from common.masks import mask_scores


class SelfAttention(nn.Module):
    """softmax(Q K^T / sqrt(Dh)) V in H heads, then ``fc_out`` (section 3.2).

    Despite the source's name it attends over whatever ``values``/``keys`` it is given: the
    query's own sequence in self-attention, the encoder output in cross-attention.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.heads = config.n_heads
        self.head_dim = config.head_dim
        # full D x D projections with bias (the source shares one Dh x Dh map across heads)
        self.values = nn.Linear(config.d_model, config.d_model)
        self.keys = nn.Linear(config.d_model, config.d_model)
        self.queries = nn.Linear(config.d_model, config.d_model)
        self.fc_out = nn.Linear(config.d_model, config.d_model)
        self.scale = math.sqrt(config.head_dim)  # sqrt(d_k), not the source's sqrt(D)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, values: Tensor, keys: Tensor, query: Tensor, mask: Tensor | None) -> Tensor:
        batch, query_len, d_model = query.shape
        key_len = keys.shape[1]
        values = self.values(values).reshape(batch, key_len, self.heads, self.head_dim)  # (B, S, H, Dh)
        keys = self.keys(keys).reshape(batch, key_len, self.heads, self.head_dim)  # (B, S, H, Dh)
        queries = self.queries(query).reshape(batch, query_len, self.heads, self.head_dim)  # (B, T, H, Dh)

        # dividing the queries, not the (B, H, T, S) energy, scales T·Dh numbers instead of T·S
        energy = torch.einsum("nqhd,nkhd->nhqk", queries / self.scale, keys)  # (B, H, T, S)
        attention = self.dropout(mask_scores(energy, mask).softmax(dim=3))  # (B, H, T, S)
        out = torch.einsum("nhql,nlhd->nqhd", attention, values)  # (B, T, H, Dh)
        return self.fc_out(out.reshape(batch, query_len, d_model))  # (B, T, D)
