"""The token batches a translation model trains and is validated on: text pairs become id
tensors (``encode_pairs``), and ``TokenBatches`` draws from them an endless, seeded stream of
batches of about ``batch_tokens`` padded positions; ``batches_by_length`` goes over every pair once.

    data = TranslationData(CorpusSettings("fra-eng.zip"), VocabularySettings(8000),
                           batch_tokens=4096, pool_size=8192, seed=0)
    batches = TokenBatches(encode_pairs(vocabulary, corpus.pairs("train")), data)
    src, tgt = next(batches)       # (B, S), (B, T): B * (S + T) <= batch_tokens

A source is its pieces then EOS; a target is BOS, its pieces, EOS (``seq2seq.data.ids``).

Shape legend:
    B  sentences (batch)   S  source length   T  target length (BOS and EOS included)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from common.checks import check_int
from seq2seq.data.corpus import CorpusSettings
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.data.subwords import Vocabulary, VocabularySettings


@dataclass(frozen=True)
class TranslationData:
    """Where a training stream's batches come from: what a checkpoint records as its ``data``
    settings, and a resumed run must share. Its numbers are the caller's, checked where they
    were given (``TranslationSettings``)."""

    corpus: CorpusSettings  # the corpus and its split
    vocabulary: VocabularySettings  # the subword vocabulary trained on its train split
    batch_tokens: int  # source + target positions per batch, padding included
    pool_size: int  # pairs drawn per batch
    seed: int  # the stream's generator



class EncodedPairs(NamedTuple):
    """Pairs as id tensors: sources ``pieces EOS``, targets ``BOS pieces EOS``."""

    sources: list[Tensor]  # each (S,)
    targets: list[Tensor]  # each (T,)


def encode_pairs(vocabulary: Vocabulary, pairs: Sequence[tuple[str, str]]) -> EncodedPairs:
    """The id tensors of (source, target) text pairs."""
    if not pairs:
        raise ValueError("no pairs to encode")
    sources = vocabulary.encode([source for source, _ in pairs])
    targets = vocabulary.encode([target for _, target in pairs])
    return EncodedPairs([torch.tensor([*ids, EOS_ID]) for ids in sources],
                        [torch.tensor([BOS_ID, *ids, EOS_ID]) for ids in targets])


def within(encoded: EncodedPairs, max_len: int) -> tuple[EncodedPairs, int]:
    """The pairs whose source and target (EOS, and BOS, included) each fit ``max_len``
    positions, and how many were left out."""
    check_int("max_len", max_len, low=1)
    kept = [(src, tgt) for src, tgt in zip(encoded.sources, encoded.targets, strict=True)
            if len(src) <= max_len and len(tgt) <= max_len]
    return EncodedPairs([src for src, _ in kept], [tgt for _, tgt in kept]), len(encoded.sources) - len(kept)


class TokenBatches:
    """An endless, seeded stream of (src, tgt) batches of about ``batch_tokens`` positions.

    Each batch draws ``pool_size`` pairs (with replacement) from ``generator``, sorts them by
    length and cuts, from a random place in that order, as many consecutive pairs as fit
    ``batch_tokens`` padded source and target positions: rows of one batch have similar
    lengths, so little of it is padding, and a batch of short sentences holds more of them.
    Everything is drawn from ``generator``: its state is the stream's position, which a
    checkpoint saves, so a resumed run draws what the uninterrupted run would have.
    """

    def __init__(self, encoded: EncodedPairs, data: TranslationData) -> None:
        if not encoded.sources or len(encoded.sources) != len(encoded.targets):
            raise ValueError(f"need as many sources as targets, at least one: got "
                             f"{len(encoded.sources)} and {len(encoded.targets)}")
        self.data = data
        self.sources, self.targets = encoded
        self.source_lengths = torch.tensor([len(ids) for ids in self.sources])  # (N,)
        self.target_lengths = torch.tensor([len(ids) for ids in self.targets])  # (N,)
        longest = int((self.source_lengths + self.target_lengths).max())
        if longest > data.batch_tokens:
            raise ValueError(f"batch_tokens {data.batch_tokens} cannot hold the longest pair "
                             f"({longest} source and target positions)")
        self.generator = torch.Generator().manual_seed(data.seed)

    def __iter__(self) -> TokenBatches:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        pool_size = self.data.pool_size
        pool = torch.randint(len(self.sources), (pool_size,), generator=self.generator)  # (P,)
        pool = pool[(self.source_lengths[pool] + self.target_lengths[pool]).argsort(stable=True)]
        start = int(torch.randint(pool_size, (1,), generator=self.generator))
        count = self._fitting(pool[start:])
        if count == pool_size - start:  # the pool ended before the budget: cut from its end instead
            count = self._fitting(pool.flip(0))
            start = pool_size - count
        rows = pool[start:start + count].tolist()
        src = nn.utils.rnn.pad_sequence([self.sources[i] for i in rows], batch_first=True,
                                        padding_value=PAD_ID)  # (B, S)
        tgt = nn.utils.rnn.pad_sequence([self.targets[i] for i in rows], batch_first=True,
                                        padding_value=PAD_ID)  # (B, T)
        return src, tgt

    def _fitting(self, rows: Tensor) -> int:
        """How many of ``rows``, from the first, fit ``batch_tokens`` padded positions: k rows
        take k * (longest source + longest target among them), which only grows with k."""
        longest = (self.source_lengths[rows].cummax(0).values
                   + self.target_lengths[rows].cummax(0).values)  # (P,)
        padded = torch.arange(1, len(rows) + 1) * longest  # (P,)
        return int((padded <= self.data.batch_tokens).sum())


def batches_by_length(encoded: EncodedPairs, batch_tokens: int) -> Iterator[tuple[Tensor, Tensor]]:
    """Every pair once, in (src, tgt) batches of similar lengths and about ``batch_tokens`` positions."""
    order = sorted(range(len(encoded.sources)),
                   key=lambda i: (len(encoded.sources[i]) + len(encoded.targets[i])))
    start = 0
    while start < len(order):
        end, longest = start, 0
        while end < len(order):
            longest_if = max(longest, len(encoded.sources[order[end]]) + len(encoded.targets[order[end]]))
            if end > start and (end - start + 1) * longest_if > batch_tokens:
                break
            longest, end = longest_if, end + 1
        rows = order[start:end]
        yield (nn.utils.rnn.pad_sequence([encoded.sources[i] for i in rows], batch_first=True,
                                         padding_value=PAD_ID),
               nn.utils.rnn.pad_sequence([encoded.targets[i] for i in rows], batch_first=True,
                                         padding_value=PAD_ID))
        start = end
