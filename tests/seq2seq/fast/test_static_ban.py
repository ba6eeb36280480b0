"""The static path applies banned ids as the teaching decoders do (one ``apply_ban`` inside the
step): ``StaticGreedy``, from the logits or the log-probabilities, and ``StaticBeam`` give
``greedy_decode``'s tokens and ``beam_search``'s hypotheses under the same ban."""

from __future__ import annotations

import pytest
import torch

from seq2seq.fast.static_search import StaticBeam, StaticGreedy
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.helpers import FLOAT64_TOL
from tests.seq2seq.search.test_banned_ids import ban_setting

BOS, EOS = 1, 2
MAX_LEN = 10


@pytest.fixture(scope="module")
def setting():
    """A float64 fused model, a padded batch, and the two ids unbanned greedy decoding chooses most."""
    model, src, src_mask, _, banned = ban_setting("fused")
    return model, src, src_mask, banned


@pytest.mark.parametrize("from_logits", [True, False], ids=["logits", "log-probs"])
def test_static_greedy_bans_as_greedy_decode_does(setting, from_logits):
    model, src, src_mask, banned = setting
    arguments = dict(max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    expected = greedy_decode(model, src, src_mask, **arguments, banned_ids=banned)
    got = StaticGreedy(model, **arguments, from_logits=from_logits, banned_ids=banned)(src, src_mask)
    assert torch.equal(got, expected)
    assert not torch.isin(got[:, 1:], torch.tensor(banned)).any()
    assert not torch.equal(got, StaticGreedy(model, **arguments, from_logits=from_logits)(src, src_mask))


def test_static_beam_bans_as_beam_search_does(setting):
    model, src, src_mask, banned = setting
    arguments = dict(max_len=MAX_LEN, bos_id=BOS, eos_id=EOS, beam_size=3)
    expected = beam_search(model, src, src_mask, **arguments, banned_ids=banned)
    got = StaticBeam(model, **arguments, banned_ids=banned)(src, src_mask)
    assert torch.equal(got.tokens, expected.tokens)
    torch.testing.assert_close(got.scores, expected.scores, **FLOAT64_TOL)
    assert not torch.isin(got.tokens[:, 1:], torch.tensor(banned)).any()
    unbanned = StaticBeam(model, **arguments)(src, src_mask)
    assert torch.isin(unbanned.tokens[:, 1:], torch.tensor(banned)).any()


def test_static_decoders_refuse_a_bad_ban_when_built(setting):
    model = setting[0]
    with pytest.raises(ValueError, match=r"banned_ids holds eos_id \(2\)"):
        StaticGreedy(model, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS, banned_ids=(EOS,))
    with pytest.raises(ValueError, match=r"banned_ids must lie in \[0, tgt_vocab_size=19\)"):
        StaticBeam(model, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS, banned_ids=(40,))
