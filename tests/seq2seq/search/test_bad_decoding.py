"""The edges of greedy decoding are defined: ``max_len`` None is refused by name (greedy
decoding has no default length), 1 gives the BOS column alone, EOS at the first step ends
every row at [BOS, EOS], and a model in train mode decodes without dropout (greedy and beam),
its modes given back as they were."""

from __future__ import annotations

import pytest
import torch

from common.config import TransformerConfig
from common.masks import padding_mask
from common.weights import export_weights, import_weights
from seq2seq.data.ids import BOS_ID, EOS_ID, PAD_ID
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
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


# --- a model in train mode -------------------------------------------------------------------


def with_dropout(copy_model, name: str) -> torch.nn.Module:
    """Variant ``name`` holding the copy model's trained weights, with dropout 0.5, in train mode."""
    model = build(name, copy_model.config.replace(dropout=0.5))
    import_weights(model, copy_model.weights)
    return model.train()


def decoder(kind: str, model, src, src_mask):
    if kind == "greedy":
        return lambda: greedy_decode(model, src, src_mask, max_len=10, bos_id=BOS_ID, eos_id=EOS_ID)
    return lambda: beam_search(model, src, src_mask, bos_id=BOS_ID, eos_id=EOS_ID, beam_size=2).tokens


@pytest.mark.parametrize("kind", ["greedy", "beam"])
@pytest.mark.parametrize("name", ["explicit", "fused", "torch"])  # cached, and the uncached reference
def test_a_model_in_train_mode_decodes_as_in_eval_mode(copy_model, name, kind):
    """Decoding switches the model to eval mode for the call: dropout 0.5 changes nothing, and
    the model is in train mode again afterwards."""
    model = with_dropout(copy_model, name)
    decode = decoder(kind, model, copy_model.src, copy_model.src_mask)
    model.eval()
    expected = decode()
    model.train()
    torch.manual_seed(0)
    assert torch.equal(decode(), expected)
    assert all(module.training for module in model.modules())


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_each_modules_mode_comes_back_even_after_an_error(copy_model, kind):
    model = with_dropout(copy_model, "explicit")
    model.encoder.eval()  # the caller's mix: a frozen encoder
    modes = {name: module.training for name, module in model.named_modules()}
    decoder(kind, model, copy_model.src, copy_model.src_mask)()
    assert {name: module.training for name, module in model.named_modules()} == modes
    bad = copy_model.src.clone()
    bad[0, 0] = copy_model.config.src_vocab_size  # encode refuses it, after the switch to eval
    with pytest.raises(ValueError, match="src"):
        decoder(kind, model, bad, copy_model.src_mask)()
    assert {name: module.training for name, module in model.named_modules()} == modes
