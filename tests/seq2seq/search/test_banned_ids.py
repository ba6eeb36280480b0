"""Banned ids are a decoding constraint that greedy decoding and beam search apply alike
(``seq2seq.search.strategy.apply_ban``): never chosen, the other ids' log-probabilities left as
the model gives them (as Hugging Face's ``generate`` does), and refused by name where they
cannot be a ban.

The expected values come from elsewhere: greedy decoding of the same model with the banned ids'
generator bias at -inf (the model itself never giving them), and beam scores recomputed from
the model's own teacher-forced forward."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from common.masks import decoder_mask, padding_mask
from common.random_batch import random_batch
from common.weights import export_weights, import_weights
from seq2seq.search.beam import beam_search, length_penalty
from seq2seq.search.greedy import greedy_decode
from tests.helpers import small_config
from variants import build

BOS, EOS = 1, 2
MAX_LEN = 10


def ban_setting(variant: str):
    """A float64 ``variant`` model, a padded batch, its unbanned greedy tokens, and the two ids
    unbanned greedy decoding chooses most (the ids a ban must change)."""
    config = small_config(dropout=0.0)
    model = build(variant, config, seed=3).double().eval()
    src, _, src_mask, _ = random_batch(config, 6, 5, 1).inputs()
    tokens = greedy_decode(model, src, src_mask, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    chosen = Counter(t for t in tokens[:, 1:].flatten().tolist() if t not in (EOS, config.pad_id))
    banned = tuple(sorted(token for token, _ in chosen.most_common(2)))
    return model, src, src_mask, tokens, banned


@pytest.fixture(scope="module")
def setting():
    return ban_setting("explicit")


def without_ids(model, banned):
    """A copy of ``model`` whose generator can never give ``banned``: their bias the most
    negative float64, so their probability is exactly 0."""
    copy = build("explicit", model.config).double().eval()
    weights = {name: tensor.clone() for name, tensor in export_weights(model).items()}
    weights["generator.bias"][list(banned)] = torch.finfo(torch.float64).min
    import_weights(copy, weights)
    return copy


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "recompute"])
def test_greedy_never_chooses_a_banned_id_and_otherwise_keeps_the_model_s_order(setting, use_cache):
    model, src, src_mask, unbanned, banned = setting
    got = greedy_decode(model, src, src_mask, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS,
                        use_cache=use_cache, banned_ids=banned)
    expected = greedy_decode(without_ids(model, banned), src, src_mask, max_len=MAX_LEN, bos_id=BOS,
                             eos_id=EOS, use_cache=use_cache)
    assert torch.equal(got, expected)
    assert not torch.isin(got[:, 1:], torch.tensor(banned)).any()
    assert not torch.equal(got, unbanned)  # the ban changed what was chosen


def test_beam_search_never_chooses_a_banned_id_and_scores_the_model_s_log_probabilities(setting):
    """The scores are the unmasked model's log-probabilities of the tokens over the length
    penalty: the ban removes ids from the choice without renormalising the others."""
    model, src, src_mask, _, banned = setting
    unbanned = beam_search(model, src, src_mask, bos_id=BOS, eos_id=EOS, beam_size=3, max_len=MAX_LEN)
    best = beam_search(model, src, src_mask, bos_id=BOS, eos_id=EOS, beam_size=3, max_len=MAX_LEN,
                       banned_ids=banned)
    tokens = best.tokens  # (B, L)
    assert not torch.isin(tokens[:, 1:], torch.tensor(banned)).any()
    assert torch.isin(unbanned.tokens[:, 1:], torch.tensor(banned)).any()  # the ban changed something
    pad = model.config.pad_id
    with torch.no_grad():
        log_probs = model(src, tokens[:, :-1], src_mask, decoder_mask(tokens[:, :-1], pad))  # (B, L-1, V)
    picked = log_probs.gather(-1, tokens[:, 1:, None])[..., 0]  # (B, L - 1)
    generated = tokens[:, 1:] != pad  # up to and with EOS (pad only after EOS)
    lp = length_penalty(generated.sum(dim=1).double(), 0.6)
    expected = picked.masked_fill(~generated, 0).sum(dim=1) / lp
    torch.testing.assert_close(best.scores, expected, atol=1e-10, rtol=0)


def test_beam_of_one_is_greedy_under_a_ban(setting):
    model, src, src_mask, _, banned = setting
    greedy = greedy_decode(model, src, src_mask, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS, banned_ids=banned)
    beam = beam_search(model, src, src_mask, bos_id=BOS, eos_id=EOS, beam_size=1, max_len=MAX_LEN,
                       banned_ids=banned).tokens
    assert torch.equal(beam, greedy[:, : beam.shape[1]])


@pytest.mark.parametrize("banned, error, said", [
    ((19,), ValueError, r"banned_ids must lie in \[0, tgt_vocab_size=19\), got 19"),
    ((-1,), ValueError, r"banned_ids must lie in \[0, tgt_vocab_size=19\), got -1"),
    ((EOS,), ValueError, r"banned_ids holds eos_id \(2\)"),
    ((True,), TypeError, "banned_ids must be an int, got bool"),
    (("3",), TypeError, "banned_ids must be an int, got str"),
    (3, TypeError, "banned_ids must be a tuple of ints, got int 3"),
])
@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_bad_banned_ids_are_refused_by_name_before_decoding(setting, banned, error, said, search):
    model, src, _, _, _ = setting
    arguments = dict(max_len=MAX_LEN, bos_id=BOS, eos_id=EOS, banned_ids=banned)
    with pytest.raises(error, match=said):
        if search == "greedy":
            greedy_decode(model, src, padding_mask(src, 0), **arguments)
        else:
            beam_search(model, src, padding_mask(src, 0), **arguments)
