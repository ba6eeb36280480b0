"""Multi-head attention written with ``torch.einsum``, in the style of source 2.

Shape legend:
    B  batch            S  source length (the key/value length)
    T  target length (the query length)
    H  heads            Dh head dim          D  model dim (d_model)
    t  positions decoded so far, this one included (a cached decode step's keys)

einsum letters, as in the source: n = B, q = query positions, k = l = key positions,
h = H, d = Dh.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from common.cache import LayerCache
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
        values, keys = self.project(values, keys)  # (B, S, H, Dh) each
        return self.attend(values, keys, query, mask)  # (B, T, D)

    def project(self, values: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        """values, keys (B, S, D) through their projections, split into heads."""
        batch, key_len, _ = keys.shape
        values = self.values(values).reshape(batch, key_len, self.heads, self.head_dim)  # (B, S, H, Dh)
        keys = self.keys(keys).reshape(batch, key_len, self.heads, self.head_dim)  # (B, S, H, Dh)
        return values, keys

    def step(self, query: Tensor, cache: LayerCache, mask: Tensor | None) -> Tensor:
        """Masked self-attention of one new position (B, 1, D) over itself and every earlier one:
        its value and key are appended to the cache's (in place), so only it is projected."""
        values, keys = self.project(query, query)  # (B, 1, H, Dh) each
        cache.self_values = torch.cat([cache.self_values, values], dim=1)  # (B, t, H, Dh)
        cache.self_keys = torch.cat([cache.self_keys, keys], dim=1)  # (B, t, H, Dh)
        return self.attend(cache.self_values, cache.self_keys, query, mask)  # (B, 1, D)

    def attend(self, values: Tensor, keys: Tensor, query: Tensor, mask: Tensor | None) -> Tensor:
        """query (B, T, D) over values and keys already projected and split: (B, S, H, Dh) each."""
        batch, query_len, d_model = query.shape
        queries = self.queries(query).reshape(batch, query_len, self.heads, self.head_dim)  # (B, T, H, Dh)

        # dividing the queries, not the (B, H, T, S) energy, scales T·Dh numbers instead of T·S
        energy = torch.einsum("nqhd,nkhd->nhqk", queries / self.scale, keys)  # (B, H, T, S)
        attention = self.dropout(mask_scores(energy, mask).softmax(dim=3))  # (B, H, T, S)
        out = torch.einsum("nhql,nlhd->nqhd", attention, values)  # (B, T, H, Dh)
        return self.fc_out(out.reshape(batch, query_len, d_model))  # (B, T, D)
