"""The sinusoid tables added to the embeddings: section 3.5's, and the two layouts of checkpoints
trained elsewhere (``TransformerConfig.positions``), shared by every variant that does not
derive its own.

    paper    PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i),  w_i = 10000^(-2i/D)   (interleaved)
    marian   PE[p] = [sin(p w_0) ... sin(p w_{D/2-1}) | cos(p w_0) ... cos(p w_{D/2-1})]
             the paper's frequencies in halves (Hugging Face's Marian): a fixed permutation of
             the paper's columns
    fairseq  the halves [sin | cos] at the position q = p + pad_id + 1, with the frequencies
             w_k = 10000^(-k/(D/2 - 1)) (fairseq's, and Hugging Face's FSMT)

Row p of each table is what the token at index p gets. fairseq numbers the real tokens of a
row pad_id + 1, pad_id + 2, ... (its ``make_positions``) and gives a padding token a zero row;
here a padding token at index p gets row p like any other token: on right-padded rows the real
tokens' positions are fairseq's, and no real position reads a padded one (the masks hide them),
so only the outputs at padded positions, which nothing reads, differ.

Every table is kept in float64 and cast where it is added.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from common.config import TransformerConfig


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(...); (max_len, D) float64.

    Kept in float64 and cast where it is added, so float64 runs are exact and lower
    precisions round once. An odd d_model drops the last cosine column.
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, ceil(D/2))
    table = torch.empty(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table


def marian_table(max_len: int, d_model: int) -> Tensor:
    """[sin(pos w_i) for every i | cos(pos w_i) for every i], w_i = 10000^(-2i/d_model): the paper's
    columns, sines first; (max_len, D) float64. An odd d_model has one more sine than cosine."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, ceil(D/2))
    return torch.cat([torch.sin(angle), torch.cos(angle[:, : d_model // 2])], dim=1)  # (max_len, D)


def fairseq_table(max_len: int, d_model: int, pad_id: int) -> Tensor:
    """Row p: [sin(q w_k) | cos(q w_k)] at q = p + pad_id + 1, w_k = 10000^(-k/(D/2 - 1)),
    k < D/2; an odd d_model ends in a zero column; (max_len, D) float64. Needs d_model >= 4."""
    half = d_model // 2
    position = torch.arange(max_len, dtype=torch.float64)[:, None] + pad_id + 1  # (max_len, 1)
    frequency = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000.0) / (half - 1)))
    angle = position * frequency  # (max_len, D/2)
    zero = torch.zeros(max_len, d_model % 2, dtype=torch.float64)  # (max_len, 0 or 1)
    return torch.cat([torch.sin(angle), torch.cos(angle), zero], dim=1)  # (max_len, D)


def position_table(config: TransformerConfig) -> Tensor:
    """The table ``config.positions`` names, (max_seq_len, D) float64: row p is added at index p."""
    if config.positions == "marian":
        return marian_table(config.max_seq_len, config.d_model)
    if config.positions == "fairseq":
        return fairseq_table(config.max_seq_len, config.d_model, config.pad_id)
    return sinusoid_table(config.max_seq_len, config.d_model)
