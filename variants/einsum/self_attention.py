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
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, values: Tensor, keys: Tensor, query: Tensor, mask: Tensor | None) -> Tensor:
        N = query.shape[0]
        value_len, key_len, query_len = values.shape[1], keys.shape[1], query.shape[1]

        # project, then split the embedding into self.heads pieces
        values = self.values(values).reshape(N, value_len, self.heads, self.head_dim)  # (B, S, H, Dh)
        keys = self.keys(keys).reshape(N, key_len, self.heads, self.head_dim)  # (B, S, H, Dh)
        queries = self.queries(query).reshape(N, query_len, self.heads, self.head_dim)  # (B, T, H, Dh)

        energy = torch.einsum("nqhd,nkhd->nhqk", queries, keys)  # (B, H, T, S)
        # scaled by sqrt(d_k), not the source's sqrt(D); masked keys get the dtype's most
        # negative value, not the source's -1e20
        attention = mask_scores(energy / math.sqrt(self.head_dim), mask).softmax(dim=3)  # (B, H, T, S)
        attention = self.dropout(attention)  # (B, H, T, S)

        out = torch.einsum("nhql,nlhd->nqhd", attention, values)  # (B, T, H, Dh)
        out = out.reshape(N, query_len, self.heads * self.head_dim)  # (B, T, D): heads concatenated
        return self.fc_out(out)  # (B, T, D)

    # --- incremental decoding: the suite's addition, not the source's ---

    def step(self, query: Tensor, cache: LayerCache, mask: Tensor | None) -> Tensor:
        """Masked self-attention of one new position (B, 1, D) over itself and every earlier one:
        its value and key are appended to the cache's (in place), so only it is projected."""
        values, keys = self.project(query, query)  # (B, 1, H, Dh) each
        cache.self_values = torch.cat([cache.self_values, values], dim=1)  # (B, t, H, Dh)
        cache.self_keys = torch.cat([cache.self_keys, keys], dim=1)  # (B, t, H, Dh)
        return self.attend(cache.self_values, cache.self_keys, query, mask)  # (B, 1, D)

    def project(self, values: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
        """``forward``'s values and keys: (B, S, D) each through its projection, split into heads."""
        N, key_len = keys.shape[:2]
        values = self.values(values).reshape(N, key_len, self.heads, self.head_dim)  # (B, S, H, Dh)
        keys = self.keys(keys).reshape(N, key_len, self.heads, self.head_dim)  # (B, S, H, Dh)
        return values, keys

    def attend(self, values: Tensor, keys: Tensor, query: Tensor, mask: Tensor | None) -> Tensor:
        """The rest of ``forward``: query (B, T, D) over values and keys already projected and
        split, (B, S, H, Dh) each."""
        N, query_len = query.shape[:2]
        queries = self.queries(query).reshape(N, query_len, self.heads, self.head_dim)  # (B, T, H, Dh)
        energy = torch.einsum("nqhd,nkhd->nhqk", queries, keys)  # (B, H, T, S)
        attention = mask_scores(energy / math.sqrt(self.head_dim), mask).softmax(dim=3)  # (B, H, T, S)
        attention = self.dropout(attention)  # (B, H, T, S)
        out = torch.einsum("nhql,nlhd->nqhd", attention, values)  # (B, T, H, Dh)
        return self.fc_out(out.reshape(N, query_len, self.heads * self.head_dim))  # (B, T, D)
