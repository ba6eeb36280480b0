"""One padded batch of random ids with the suite's masks, shared by tests, scripts and benchmarks.

    batch = random_batch(config, batch=3, src_len=7, tgt_len=5, seed=0)
    log_probs = model(*batch.inputs())   # src, tgt, src_mask, tgt_mask

Row r ends in r padding tokens (row 0 is full), but every row keeps at least one real source
token and a real first target token, so no attention row is fully masked and every position
of every variant can be compared with the reference. The same seed gives the same batch.

Shape legend:
    B  batch    S  source length    T  target length
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from common.checks import check_int
from common.config import TransformerConfig
from common.masks import decoder_mask, padding_mask


@dataclass(frozen=True)
class Batch:
    """The ids, the suite's masks and next-token labels of one padded batch."""

    src: Tensor  # (B, S) source ids
    tgt: Tensor  # (B, T) target ids, the decoder's input
    labels: Tensor  # (B, T) a random next token at each target position, pad where tgt is pad
    src_mask: Tensor  # (B, 1, 1, S) padding_mask(src)
    tgt_mask: Tensor  # (B, 1, T, T) decoder_mask(tgt)

    def inputs(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The four arguments of ``model(src, tgt, src_mask, tgt_mask)``."""
        return self.src, self.tgt, self.src_mask, self.tgt_mask

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(tensor.to(device) for tensor in
                       (self.src, self.tgt, self.labels, self.src_mask, self.tgt_mask)))


def random_batch(config: TransformerConfig, batch: int = 3, src_len: int = 7, tgt_len: int = 5,
                 *, seed: int = 0, device: torch.device | str = "cpu") -> Batch:
    """Real ids drawn uniformly from the vocabulary without ``config.pad_id``, then trailing
    padding; see the module docstring. Ids are drawn from [1, vocab) and pad_id is renamed 0
    (a permutation of the ids), so a real token is never padding, and with pad_id 0 the batch
    is the one drawn from [1, vocab) directly."""
    for name, value in (("batch", batch), ("src_len", src_len), ("tgt_len", tgt_len)):
        check_int(name, value, low=1)
    generator = torch.Generator().manual_seed(seed)
    pad = config.pad_id

    def real(vocab: int, shape: tuple[int, int]) -> Tensor:  # uniform over [0, vocab) minus pad
        ids = torch.randint(1, vocab, shape, generator=generator)
        return ids.masked_fill(ids == pad, 0)

    src = real(config.src_vocab_size, (batch, src_len))  # (B, S)
    tgt = real(config.tgt_vocab_size, (batch, tgt_len))  # (B, T)
    rows = torch.arange(batch)[:, None]  # (B, 1): row r gets r padding tokens
    src = src.masked_fill(torch.arange(src_len) >= (src_len - rows).clamp(min=1), pad)
    tgt = tgt.masked_fill(torch.arange(tgt_len) >= (tgt_len - rows).clamp(min=1), pad)
    labels = real(config.tgt_vocab_size, (batch, tgt_len))
    labels = labels.masked_fill(tgt == pad, pad)  # (B, T)
    return Batch(src, tgt, labels, padding_mask(src, pad), decoder_mask(tgt, pad)).to(device)
