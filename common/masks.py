"""Attention masks. Convention: bool, True = may attend, broadcastable to (B, H, T_query, T_key).

``None`` means attend everywhere. Rank 4, (B or 1, H or 1, T_query or 1, T_key), is always
accepted. A lower rank lines up from the right, as broadcasting does: (T_key,), (T_query, T_key),
(H, T_query, T_key). Where that reading could hinge on a coincidence of sizes, a rank-2 or rank-3
mask whose first axis has the batch size (the tutorials' (B, 1, S), a (B, S) key mask), it is
refused with the four-axis layout to use (``common.checks``), never guessed.

Masked scores are *filled* (never added) with the dtype's most negative finite value, so a
fully masked row is a uniform, finite softmax in every dtype and every from-scratch variant
gives the same numbers there.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, 1, 1, S): True at real tokens, False at padding keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device | str | None = None) -> Tensor:
    """(1, 1, T, T) lower-triangular: query t may attend to keys 0..t."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def target_padding_mask(tgt: Tensor, pad_id: int) -> Tensor:
    """(B, T) target ids -> (B, 1, 1, T): True at real tokens and at position 0.

    Position 0 holds the decoder's start token, a key whatever its id: Marian's decoder starts
    with the padding id itself (``TransformerConfig.decoder_start``). Every other target starts
    with a BOS that is not padding, so for them this is ``padding_mask``."""
    start = torch.arange(tgt.shape[1], device=tgt.device) == 0  # (T,): the start token's column
    return ((tgt != pad_id) | start)[:, None, None, :]


def decoder_mask(tgt: Tensor, pad_id: int) -> Tensor:
    """(B, T) target ids -> (B, 1, T, T): causal and not padding (the start token at position 0
    is never padding), the decoder self-attention mask."""
    return target_padding_mask(tgt, pad_id) & causal_mask(tgt.shape[1], device=tgt.device)


def mask_scores(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Fill the scores a query may not attend to with the dtype's most negative finite value."""
    if mask is None:
        return scores
    return scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
