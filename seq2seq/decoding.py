"""Greedy decoding through the interface every variant shares: encode, decode, project.

    tokens = greedy_decode(model.eval(), src, padding_mask(src, pad_id),
                           max_len=20, bos_id=1, eos_id=2)  # (B, L), L <= 20

The source is encoded once. The target starts as BOS and grows by one token per step: the
decoder reads the whole prefix under the usual causal and padding mask, and the generator's
most likely next token at the last position is appended. A sequence that has produced EOS is
finished; it is extended with padding from then on, and the loop ends as soon as every
sequence in the batch is finished (or ``max_len`` is reached). Without a key/value cache each
step recomputes the prefix, the price of going through the plain interface.

Shape legend:
    B  batch    S  source length    L  generated length (BOS included)    V  target vocabulary
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from common.masks import decoder_mask


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    max_len: int,
    bos_id: int,
    eos_id: int,
) -> Tensor:
    """Most likely token at each step, batched: (B, S) source ids -> (B, L) target ids.

    Every row starts with ``bos_id``; after a row's ``eos_id`` it holds ``config.pad_id``.
    ``L <= max_len`` counts BOS; L is shorter when every row has reached EOS earlier.
    ``src_mask`` masks source keys, e.g. ``padding_mask(src, pad_id)`` of shape (B, 1, 1, S);
    ``None`` attends everywhere, as in ``encode``. Dropout is the caller's business: put the
    model in eval mode first for deterministic output. The model's mode is left unchanged.
    """
    config = _check_arguments(model, src_mask, max_len, bos_id, eos_id)
    pad_id = config.pad_id
    memory = model.encode(src, src_mask)  # (B, S, D); encode checks src and src_mask
    batch = src.shape[0]
    tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
    # One step per generated position: each step needs the token the previous one chose.
    for _ in range(max_len - 1):
        hidden = model.decode(tokens, memory, src_mask, decoder_mask(tokens, pad_id))  # (B, L, D)
        next_token = model.project(hidden[:, -1]).argmax(dim=-1)  # (B,)
        next_token = next_token.masked_fill(finished, pad_id)  # finished rows only pad
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, L + 1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return tokens


def _check_arguments(
    model: object, src_mask: object, max_len: object, bos_id: object, eos_id: object
) -> TransformerConfig:
    """Everything ``encode`` does not check itself; raises before any tensor work."""
    if not isinstance(model, nn.Module) or not all(
        callable(getattr(model, method, None)) for method in ("encode", "decode", "project")
    ):
        raise TypeError(
            "model must be an nn.Module with encode, decode and project (see variants.build), "
            f"got {type(model).__name__}"
        )
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"model.config must be a TransformerConfig, got {type(config).__name__}")
    for name, value in (("max_len", max_len), ("bos_id", bos_id), ("eos_id", eos_id)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= max_len <= config.max_seq_len:
        raise ValueError(
            f"max_len must lie in [1, max_seq_len={config.max_seq_len}] (it counts BOS), "
            f"got {max_len}"
        )
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not 0 <= value < config.tgt_vocab_size:
            raise ValueError(
                f"{name} must lie in [0, tgt_vocab_size={config.tgt_vocab_size}), got {value}"
            )
        if value == config.pad_id:
            # BOS as padding would mask the only key of the first step; EOS as padding could
            # not be told apart from the padding that follows it.
            raise ValueError(f"{name} must differ from config.pad_id ({config.pad_id}), got {value}")
    if bos_id == eos_id:
        raise ValueError(f"bos_id and eos_id must differ, both are {bos_id}")
    if isinstance(src_mask, Tensor) and src_mask.ndim >= 2 and src_mask.shape[-2] != 1:
        # the same mask serves encoder self-attention (S queries) and cross-attention (L queries)
        raise ValueError(
            "src_mask must mask source keys only, with a query dimension of 1, e.g. "
            f"padding_mask(src, pad_id) of shape (B, 1, 1, S); got shape {tuple(src_mask.shape)}"
        )
    return config
