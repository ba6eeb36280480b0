"""The edges of greedy decoding are defined: ``max_len`` None is refused by name (greedy
decoding has no default length), 1 gives the BOS column alone, and EOS at the first step ends
every row at [BOS, EOS]."""

from __future__ import annotations

import pytest
import torch

from common.config import TransformerConfig
from common.masks import padding_mask
from common.weights import export_weights, import_weights
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decoding.greedy import greedy_decode
from variants import build

CONFIG = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=16, dropout=0.0,
                           src_vocab_size=9, tgt_vocab_size=9, max_seq_len=8)
SRC = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0], [8, 3, 4, 5]])


def eager_to_end(name: str) -> torch.nn.Module:
    """Variant ``name`` whose generator bias makes EOS the most likely token at every step."""
    model = build(name, CONFIG, seed=0)
    weights = export_weights(model)
    weights["generator.bias"][EOS_ID] = 50.0
    import_weights(model, weights)
    return model.eval()


@pytest.mark.parametrize("name", ["explicit", "torch"])  # a cached and an uncached decoder
def test_eos_at_the_first_step_ends_every_row(name):
    tokens = greedy_decode(eager_to_end(name), SRC, padding_mask(SRC, PAD_ID), max_len=6,
                           bos_id=BOS_ID, eos_id=EOS_ID)
    assert torch.equal(tokens, torch.tensor([[BOS_ID, EOS_ID]] * 3))


def test_max_len_one_is_the_bos_column():
    tokens = greedy_decode(eager_to_end("explicit"), SRC, None, max_len=1, bos_id=BOS_ID, eos_id=EOS_ID)
    assert torch.equal(tokens, torch.tensor([[BOS_ID]] * 3))


def test_max_len_none_is_refused_by_name():
    with pytest.raises(TypeError, match=r"max_len must be an int, .*greedy decoding has no default"):
        greedy_decode(eager_to_end("explicit"), SRC, None, max_len=None, bos_id=BOS_ID, eos_id=EOS_ID)
