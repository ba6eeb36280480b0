"""``common.random_batch.random_batch`` keeps its docstring's promise for any ``pad_id``.

Padding stands exactly at the trailing positions (row r ends in r pads, every row keeps a real
source token and a real first target token), and no real position holds the pad id: with a
pad id in the middle of the vocabulary, a draw that may return it would put padding where the
layout has a real token, and a row could lose every key.
"""

from __future__ import annotations

import pytest
import torch

from common.masks import decoder_mask, padding_mask
from common.random_batch import random_batch
from tests.helpers import small_config

VOCAB = 7  # small, so that across many draws every id, the pad id included, would come up


def layout(batch: int, length: int) -> torch.Tensor:
    """(B, L) True at the positions the docstring calls real: row r loses its last r, keeps one."""
    rows = torch.arange(batch)[:, None]
    return torch.arange(length) < (length - rows).clamp(min=1)


@pytest.mark.parametrize("pad_id", [0, 3, VOCAB - 1])
def test_padding_only_where_the_layout_puts_it(pad_id):
    config = small_config(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, pad_id=pad_id)
    batch, src_len, tgt_len = 4, 9, 6
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    for seed in range(50):
        drawn = random_batch(config, batch, src_len, tgt_len, seed=seed)
        for ids, real in ((drawn.src, layout(batch, src_len)), (drawn.tgt, layout(batch, tgt_len)),
                          (drawn.labels, layout(batch, tgt_len))):
            assert torch.equal(ids == pad_id, ~real), f"seed {seed}: pad {pad_id} off the layout"
            seen[ids[real]] = True
        assert torch.equal(drawn.src_mask, padding_mask(drawn.src, pad_id))
        assert torch.equal(drawn.tgt_mask, decoder_mask(drawn.tgt, pad_id))
    # every id but the pad id is drawn as a real token: the draw excludes pad, nothing else
    assert seen.tolist() == [i != pad_id for i in range(VOCAB)]


def test_pad_zero_batches_are_unchanged():
    """With pad_id 0 real ids come from [1, vocab) as before, so seeded tables stay as measured."""
    config = small_config()
    generator = torch.Generator().manual_seed(5)
    src = torch.randint(1, config.src_vocab_size, (3, 7), generator=generator)
    drawn = random_batch(config, 3, 7, 5, seed=5)
    real = layout(3, 7)
    assert torch.equal(drawn.src[real], src[real])
