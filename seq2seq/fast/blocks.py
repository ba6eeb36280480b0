"""Greedy decoding's argmax and beam search's k best extensions over a large vocabulary, found
block by block: the fast path's choice of the next ids (``StaticGreedy`` and ``StaticBeam``,
eager, on the CPU). Each gives what ``Tensor.argmax`` and ``Tensor.topk`` give, by reading every
score once with a maximum per block and then choosing within the few blocks that can hold the
answer.

    ids = argmax(logits)                          # (R, V) -> (R,), as logits.argmax(dim=-1)
    top, index = best_extensions(scores, logp)    # as seq2seq.search.beam.best_extensions

Why it is exact. Split each row's V entries into blocks of ``block`` consecutive entries (V a
multiple of it) and take each block's maximum.

- argmax: the first block whose maximum is the row's maximum holds the row's first maximal
  entry, and that entry is the first maximal entry of its block. NaN counts as the largest value
  in ``argmax`` and is propagated by ``amax``, so a row with a NaN gives its first NaN, as
  ``argmax`` does.
- top k: an entry among a row's k largest lies in a block whose maximum is among the k largest
  block maxima (any other block's maximum is no larger than those k maxima, entries of k other
  blocks, and neither is any entry of it). So the k largest entries of those k blocks are the
  row's k largest.
  Beam search's entries are sums, a beam's live log P plus each token's log-probability; rounding
  is monotone, so a block's largest sum is its largest log-probability plus the beam's log P, and
  the maxima are taken of the log-probabilities alone: the (B, k·V) sums are never written. The
  sums of the chosen blocks are the same additions ``best_extensions`` makes, so the values are
  bit for bit its values. Among exactly equal values, which index comes first is not specified,
  by ``topk`` or here.

Where V has no divisor in [``MIN_BLOCK``, ``MAX_BLOCK``], ``block_size`` is None and the
functions fall back to ``argmax`` and ``topk`` over the whole row. The measurements that chose
block by block on the CPU, and the sizes, are in docs/results/cpu-base-layerwise-decoding.md.

Shape legend:
    R  rows   B  sources   k  beams per source   V  vocabulary   n  blocks per row (V / block)
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from seq2seq.search import beam

MIN_BLOCK, MAX_BLOCK = 128, 1024  # a block's size: the largest divisor of V in this range


@functools.cache
def block_size(vocab: int) -> int | None:
    """The largest divisor of ``vocab`` in [MIN_BLOCK, MAX_BLOCK] that leaves more than one
    block, or None (no such divisor: choose over whole rows)."""
    sizes = [size for size in range(min(MAX_BLOCK, vocab // 2), MIN_BLOCK - 1, -1) if vocab % size == 0]
    return sizes[0] if sizes else None


def block_starts(chosen: Tensor, block: int) -> Tensor:
    """(..., m) chosen block numbers -> (..., m·block) the indices of their entries, block by
    block."""
    offsets = torch.arange(block, device=chosen.device)  # (block,)
    return (chosen[..., None] * block + offsets).flatten(-2)  # (..., m·block)


def argmax(logits: Tensor, block: int | None = None) -> Tensor:
    """(R, V) -> (R,) the index of each row's first largest entry, as ``logits.argmax(dim=-1)``,
    by block maxima (``block`` None: ``block_size(V)``)."""
    rows, vocab = logits.shape
    block = block or block_size(vocab)
    if block is None:
        return logits.argmax(dim=-1)
    maxima = logits.view(rows, vocab // block, block).amax(dim=-1)  # (R, n)
    candidates = block_starts(maxima.argmax(dim=-1, keepdim=True), block)  # (R, block)
    within = logits.gather(1, candidates).argmax(dim=-1, keepdim=True)  # (R, 1)
    return candidates.gather(1, within)[:, 0]  # (R,)


def best_extensions(scores: Tensor, logp: Tensor, block: int | None = None) -> tuple[Tensor, Tensor]:
    """``seq2seq.search.beam.best_extensions`` by block maxima: (B, k) live log P and (B, k, V)
    next-token log-probabilities -> the k best sums (B, k), largest first, and their indices
    in the (B, k·V) of every beam's every token (``block`` None: ``block_size(V)``)."""
    batch, k, vocab = logp.shape
    block = block or block_size(vocab)
    if block is None:
        return beam.best_extensions(scores, logp)
    blocks = vocab // block
    maxima = logp.view(batch, k, blocks, block).amax(dim=-1) + scores[:, :, None]  # (B, k, n)
    chosen = maxima.view(batch, k * blocks).topk(k, dim=1).indices  # (B, k): blocks of the k·V
    candidates = block_starts(chosen, block)  # (B, k·block): indices into the k·V
    beams = scores.gather(1, chosen // blocks)  # (B, k): the live log P of each chosen block's beam
    sums = beams[:, :, None] + logp.view(batch, k * vocab).gather(1, candidates).view(batch, k, block)
    top, within = sums.flatten(1).topk(k, dim=1)  # (B, k) of the (B, k·block)
    return top, candidates.gather(1, within)
