"""Greedy decoding (``greedy_decode``) through the interface every variant shares, with a
key/value cache where the model has one.

    tokens = greedy_decode(model.eval(), src, padding_mask(src, pad_id),
                           max_len=20, bos_id=1, eos_id=2)  # (B, L), L <= 20

The source is encoded once. The target starts as BOS and grows by one token per step: the
generator's most likely next token is appended. A sequence that has produced EOS is finished;
it is extended with padding from then on, and the loop ends as soon as every sequence in the
batch is finished (or ``max_len`` is reached).

Each step's log-probabilities come from ``NextToken``, the cached next-token step that beam
search steps with too; it, the argument checks (``check_arguments``) and the eval mode both
searches decode in (``eval_mode``) live in ``seq2seq.search.strategy``, what every search
shares.

Shape legend:
    B  batch   S  source length   L  generated length (BOS included)   V  target vocabulary
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.search.strategy import NextToken, check_arguments, check_no_empty_source, eval_mode


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    max_len: int,
    bos_id: int,
    eos_id: int,
    use_cache: bool = True,
    banned_ids: tuple[int, ...] = (),
) -> Tensor:
    """Most likely token at each step, batched: (B, S) source ids -> (B, L) target ids.

    Every row starts with ``bos_id``; after a row's ``eos_id`` it holds ``config.pad_id``.
    ``L <= max_len`` counts BOS; L is shorter when every row has reached EOS earlier: EOS
    chosen at the first step everywhere gives (B, 2) rows of BOS, EOS. ``max_len=1`` gives the
    BOS column alone; ``max_len`` has no default (None is a ``TypeError``).
    ``src_mask`` masks source keys, e.g. ``padding_mask(src, pad_id)`` of shape (B, 1, 1, S);
    ``None`` attends everywhere, as in ``encode``. ``use_cache=False`` decodes by full recompute
    even where the model has a cache (the tokens are the same). Decodes in eval mode, without
    dropout, whatever mode the model is in: a model in train mode is switched to eval for the
    call, and each module's own mode is given back afterwards, after an exception too
    (``eval_mode``). ``banned_ids`` are never chosen (a model file's ``banned_ids``: their
    log-probabilities are -inf, ``seq2seq.search.strategy.apply_ban``).
    """
    config = check_arguments(model, src_mask, max_len, bos_id, eos_id, use_cache, max_len_may_be_none=False,
                             banned_ids=banned_ids)
    check_no_empty_source(src, src_mask)
    pad_id = config.pad_id
    with eval_mode(model):
        next_token_logp = NextToken(model, src, src_mask, use_cache, banned_ids)
        batch = src.shape[0]
        tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        finished = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
        # One step per generated position: each step needs the token the previous one chose.
        for _ in range(max_len - 1):
            next_token = next_token_logp(tokens).argmax(dim=-1)  # (B,)
            next_token = next_token.masked_fill(finished, pad_id)  # finished rows only pad
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, L + 1)
            finished |= next_token == eos_id
            if finished.all():
                break
    return tokens
