"""Beam search as section 6.1 of the paper runs it: beam size 4, length penalty α = 0.6, output
at most 50 tokens longer than the source.

    best = beam_search(model.eval(), src, padding_mask(src, pad_id), bos_id=1, eos_id=2)
    best.tokens  # (B, L) the best hypothesis of each source: BOS first, padding after EOS
    best.scores  # (B,) its log-probability divided by lp(Y)

A hypothesis Y is scored log P(Y | source) / lp(Y), with the length penalty of Wu et al. (2016)
that the paper cites, lp(Y) = ((5 + |Y|) / 6)^α; |Y| counts the generated tokens, EOS included,
BOS not. Each step extends every live hypothesis by every token and keeps the ``beam_size``
best extensions; those that end — with EOS, or at the length limit — leave the beam as finished
hypotheses, the rest stay live. A source is done when no live hypothesis can beat its best
finished one any more: a live log-probability only falls as it grows, so the most it can still
score is its log-probability over lp at the length limit, the longest it can still reach (a
bound taken at the current length would stop too early, and lose a long hypothesis that the
penalty favours). A finished hypothesis is final: it never grows and its score never changes.
With ``beam_size=1`` this is greedy decoding: the one extension kept is the most likely token,
and EOS ends the search. With ``max_len=1`` no id fits after BOS: the result is BOS alone, the
empty hypothesis, scored log 1 / lp(0) = 0, as greedy decoding returns BOS alone.

Batched over B sources x k beams, as B·k rows: the cache (``seq2seq.search.strategy.NextToken``) is
expanded to B·k rows once, then after every step reordered by each surviving hypothesis's
origin row (``index_select``); no Python loop runs over rows or beams.

Shape legend:
    B  sources (batch)   k  beam size   V  target vocabulary   L  hypothesis length (BOS included)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from seq2seq.search.strategy import NextToken, check_beam_arguments, eval_mode

BEAM_SIZE = 4  # section 6.1
ALPHA = 0.6  # section 6.1
EXTRA_LENGTH = 50  # section 6.1: maximum output length = input length + 50


class Hypotheses(NamedTuple):
    """The best hypothesis of each source."""

    tokens: Tensor  # (B, L) BOS, the generated ids, then padding
    scores: Tensor  # (B,) log P(Y | source) / lp(Y)


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α, with |Y| the generated tokens (Wu et al., 2016, eq. 14)."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor | None = None,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = BEAM_SIZE,
    alpha: float = ALPHA,
    max_len: int | None = None,
    use_cache: bool = True,
    banned_ids: tuple[int, ...] = (),
) -> Hypotheses:
    """The best-scoring hypothesis of each (B, S) source that the beam finds.

    ``max_len`` counts BOS, as in ``greedy_decode``; None: a source of n real (non-padding) ids
    gets at most n + 50 generated ids, and every row fits in ``max_seq_len`` positions.
    ``use_cache=False`` decodes by full recompute even where the model has a cache. Decodes in
    eval mode, as ``greedy_decode`` does: a model in train mode runs without dropout, and each
    module's mode is given back afterwards. ``banned_ids`` are never chosen: their
    log-probabilities are -inf and the others' are left as they are (``apply_ban``), so the
    scores are ``generate``'s under its bad-words processor.
    """
    config = check_beam_arguments(model, src, src_mask, max_len, bos_id, eos_id, use_cache,
                                  beam_size, alpha, banned_ids=banned_ids)
    with eval_mode(model):
        next_token_logp = NextToken(model, src, src_mask, use_cache, banned_ids)  # encodes, and checks src
        rows = torch.arange(src.shape[0], device=src.device)  # (B,)
        next_token_logp.reorder(rows.repeat_interleave(beam_size))  # B -> B·k rows: each source once per beam
        # log-probabilities add up in float32 at least, float64 in a float64 model
        dtype = torch.promote_types(next_token_logp.memory.dtype, torch.float32)
        return search(next_token_logp, generated_limit(config, src, max_len), dtype, bos_id=bos_id,
                      eos_id=eos_id, pad_id=config.pad_id, beam_size=beam_size, alpha=alpha)


def generated_limit(config: TransformerConfig, src: Tensor, max_len: int | None) -> Tensor:
    """(B,) the most ids each row may generate after BOS: ``max_len - 1``, or with None, the
    source's real (non-padding) ids + 50, within ``max_seq_len`` positions."""
    if max_len is None:
        return ((src != config.pad_id).sum(dim=1) + EXTRA_LENGTH).clamp(max=config.max_seq_len - 1)
    return torch.full((src.shape[0],), max_len - 1, device=src.device)  # (B,)


def best_extensions(scores: Tensor, logp: Tensor) -> tuple[Tensor, Tensor]:
    """(B, k) live log P and (B, k, V) next-token log-probabilities -> the k best extensions of
    the k beams: their log P (B, k), largest first, and their indices in the (B, k·V) of every
    beam's every token (index // V the beam, index % V the token)."""
    batch, k, vocab = logp.shape
    return (scores[:, :, None] + logp).view(batch, k * vocab).topk(k, dim=1)


def search(next_token_logp: NextToken, limit: Tensor, dtype: torch.dtype, *, bos_id: int, eos_id: int,
           pad_id: int, beam_size: int, alpha: float,
           extend: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] = best_extensions) -> Hypotheses:
    """The search itself, on any next-token step over B·k rows (B sources, k beams each, row
    i·k + j the j-th beam of source i) with a ``reorder``: ``NextToken``, or the static step of
    ``seq2seq.fast.static_search``. ``limit`` (B,) caps each source's generated ids; scores add up
    in ``dtype``. ``extend`` finds each step's k best extensions (``best_extensions``, or the fast
    path's ``seq2seq.fast.blocks.best_extensions``, the same values)."""
    batch, k, device = limit.shape[0], beam_size, limit.device
    reachable_lp = length_penalty(limit.to(dtype), alpha)  # (B,) lp at each row's length limit
    rows = torch.arange(batch, device=device)  # (B,)
    tokens = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)  # (B·k, L)
    scores = torch.full((batch, k), -math.inf, dtype=dtype, device=device)  # (B, k) live log P
    scores[:, 0] = 0.0  # the k beams start as one hypothesis: BOS
    best_tokens = torch.full((batch, int(limit.max()) + 1), pad_id, device=device)  # (B, L)
    best_tokens[:, 0] = bos_id
    # the empty hypothesis (log P = 0) is the best of a row with no room after BOS; any other
    # row's first finished hypothesis replaces -inf
    best_scores = torch.where(limit == 0, 0.0, -math.inf).to(dtype)  # (B,)
    best_length = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) |Y| of the best
    for length in range(1, int(limit.max()) + 1):  # |Y| after this step
        logp = next_token_logp(tokens).view(batch, k, -1)  # (B, k, V)
        vocab = logp.shape[-1]
        top, index = extend(scores, logp)  # (B, k): the k best extensions of the k beams
        beam, token = index // vocab, index % vocab  # (B, k) origin beam and new id
        ends = (token == eos_id) | (length >= limit)[:, None]  # (B, k)
        # finished: the best normalised score that ends here, kept where it beats the row's best
        finished, pick = (top / length_penalty(length, alpha)).masked_fill(~ends, -math.inf).max(dim=1)
        better = finished > best_scores  # (B,)
        finished_row = rows * k + beam.gather(1, pick[:, None])[:, 0]  # (B,) its beam's row
        hypothesis = torch.cat([tokens.index_select(0, finished_row), token.gather(1, pick[:, None])], dim=1)
        best_tokens[:, : length + 1] = torch.where(better[:, None], hypothesis, best_tokens[:, : length + 1])
        best_scores = torch.where(better, finished, best_scores)
        best_length = torch.where(better, length, best_length)
        # live: the extensions that did not end; a row is done when none can still beat its best
        scores = top.masked_fill(ends, -math.inf)  # (B, k)
        done = best_scores >= scores.max(dim=1).values / reachable_lp  # (B,)
        if done.all():
            break
        scores = scores.masked_fill(done[:, None], -math.inf)
        origin = (rows[:, None] * k + beam).view(-1)  # (B·k,) each new beam's row before the step
        next_token_logp.reorder(origin)
        tokens = torch.cat([tokens.index_select(0, origin), token.view(-1, 1)], dim=1)  # (B·k, length + 1)
    return Hypotheses(best_tokens[:, : int(best_length.max()) + 1], best_scores)
