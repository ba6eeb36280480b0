"""Beam search (section 6.1): the length penalty by hand, beam 1 = greedy, the exhaustive-search
optimum found by a beam wide enough to keep every prefix, the reference's hypotheses and scores
in every from-scratch variant, the output length limit, and its argument checks."""

from __future__ import annotations

import math

import pytest
import torch

from common.config import TransformerConfig
from common.masks import decoder_mask, padding_mask
from common.random_batch import random_batch
from common.weights import import_weights
from seq2seq.data import tasks
from seq2seq.search.beam import beam_search, length_penalty
from seq2seq.search.greedy import greedy_decode
from tests.helpers import FLOAT64_TOL, random_canonical
from variants import REFERENCE, build

PAD, BOS, EOS = 0, 1, 2


def test_length_penalty_is_the_formula_worked_by_hand():
    """lp(Y) = ((5 + |Y|) / 6)^α."""
    assert length_penalty(1, 0.6) == 1.0  # (6 / 6)^0.6
    assert length_penalty(7, 0.6) == pytest.approx(2**0.6)  # (12 / 6)^0.6
    assert length_penalty(7, 0.6) == pytest.approx(1.515716566510398)
    assert length_penalty(25, 1.0) == pytest.approx(5.0)  # 30 / 6
    assert length_penalty(40, 0.0) == 1.0
    assert torch.allclose(length_penalty(torch.tensor([1.0, 7.0]), 0.6), torch.tensor([1.0, 2**0.6]))


def sequence_log_prob(model, src, src_mask, tokens: torch.Tensor) -> torch.Tensor:
    """log P(tokens[1:] | source) by teacher forcing, summed up to and including the first EOS."""
    with torch.no_grad():
        logp = model(src, tokens[:, :-1], src_mask, decoder_mask(tokens[:, :-1], PAD))  # (B, L-1, V)
    picked = logp.gather(2, tokens[:, 1:, None])[..., 0]  # (B, L - 1)
    return picked.masked_fill(tokens[:, 1:] == PAD, 0.0).sum(dim=1)


def test_scores_are_log_probability_over_the_length_penalty(copy_model):
    model = copy_model.build("explicit", torch.float64)
    best = beam_search(model, copy_model.src, copy_model.src_mask, bos_id=BOS, eos_id=EOS)
    lengths = (best.tokens[:, 1:] != PAD).sum(dim=1)  # |Y|: EOS counted, BOS not
    by_hand = sequence_log_prob(model, copy_model.src, copy_model.src_mask, best.tokens) \
        / ((5 + lengths.double()) / 6) ** 0.6
    torch.testing.assert_close(best.scores, by_hand, **FLOAT64_TOL)
    assert (best.tokens[:, 0] == BOS).all() and len(lengths.unique()) > 3


def test_beam_of_one_is_greedy(copy_model, variant):
    model = copy_model.build(variant, torch.float64)
    arguments = dict(bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID, max_len=10)
    greedy = greedy_decode(model, copy_model.src, copy_model.src_mask, **arguments)
    beam = beam_search(model, copy_model.src, copy_model.src_mask, beam_size=1, **arguments)
    assert torch.equal(beam.tokens, greedy)


@pytest.fixture(scope="module")
def reference_beam(copy_model):
    """The reference's beam (by full recompute, float64): the expected value."""
    model = copy_model.build(REFERENCE, torch.float64)
    arguments = dict(bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    found = beam_search(model, copy_model.src, copy_model.src_mask, **arguments)
    greedy = greedy_decode(model, copy_model.src, copy_model.src_mask, max_len=10, **arguments)
    assert not torch.equal(found.tokens, greedy), "a beam that only finds greedy's proves less"
    return found


def test_every_variant_finds_the_reference_hypotheses_and_scores(copy_model, subject_variant,
                                                                 reference_beam):
    """float64; each from-scratch variant steps with its cache, the reference recomputes."""
    best = beam_search(copy_model.build(subject_variant, torch.float64), copy_model.src,
                       copy_model.src_mask, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    assert torch.equal(best.tokens, reference_beam.tokens)
    torch.testing.assert_close(best.scores, reference_beam.scores, **FLOAT64_TOL)


TINY = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0, src_vocab_size=7,
                         tgt_vocab_size=5, max_seq_len=8)  # target ids: PAD, BOS, EOS, 3, 4


def exhaustive_best(model, src, src_mask, generated: int, alpha: float) -> list[tuple[float, list[int]]]:
    """Per source, the best of every hypothesis with at most ``generated`` ids — those that end
    with their first EOS, and those cut at the limit — by log P / lp: (score, ids after BOS)."""
    with torch.no_grad():
        memory = model.encode(src, src_mask)
    best = []
    for row in range(src.shape[0]):
        frontier, frontier_logp = [[BOS]], [0.0]  # prefixes without EOS, and their log P
        candidates = []
        for length in range(1, generated + 1):
            prefixes = torch.tensor(frontier)  # (N, length)
            n = len(frontier)
            with torch.no_grad():
                hidden = model.decode(prefixes, memory[row : row + 1].expand(n, -1, -1),
                                      src_mask[row : row + 1], decoder_mask(prefixes, PAD))
                logp = model.project(hidden)[:, -1].tolist()  # (N, V)
            grown, grown_logp = [], []
            for prefix, prefix_logp, next_logp in zip(frontier, frontier_logp, logp, strict=True):
                for token, token_logp in enumerate(next_logp):
                    total = prefix_logp + token_logp
                    if token == EOS or length == generated:
                        candidates.append((total / ((5 + length) / 6) ** alpha, [*prefix[1:], token]))
                    else:
                        grown.append([*prefix, token])
                        grown_logp.append(total)
            frontier, frontier_logp = grown, grown_logp
        best.append(max(candidates))
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("name", ["explicit", "torch"])
def test_a_beam_that_keeps_every_prefix_finds_the_exhaustive_optimum(name, alpha):
    """5 target ids, at most 4 generated: the widest step has 4^2 live prefixes x 5 extensions,
    so a beam of 80 drops none and must return the optimum of the penalised score."""
    model = build(name, TINY)
    state = random_canonical(TINY, seed=0)
    state["generator.weight"] *= 3  # peaked next-token distributions, and EOS a little less
    state["generator.bias"][EOS] -= 1.0  # likely: the optima come in lengths 2, 3 and 4
    import_weights(model, state)
    model.double().eval()
    src, _, src_mask, _ = random_batch(TINY, batch=8, src_len=5, tgt_len=1, seed=4).inputs()
    generated = 4
    found = beam_search(model, src, src_mask, bos_id=BOS, eos_id=EOS, beam_size=4 * 4 * 5,
                        alpha=alpha, max_len=generated + 1)
    optimum = exhaustive_best(model, src, src_mask, generated, alpha)
    for row, (score, ids) in enumerate(optimum):
        assert found.tokens[row, 1 : len(ids) + 1].tolist() == ids, row
        assert (found.tokens[row, len(ids) + 1 :] == PAD).all(), row
        assert found.scores[row].item() == pytest.approx(score, abs=1e-10, rel=0), row
    assert len({len(ids) for _, ids in optimum}) > 1, "optima of one length prove less"


def test_output_is_at_most_source_length_plus_50_within_max_seq_len():
    """A model that never says EOS (nor PAD or BOS) runs every row to its limit: a source of 2
    real ids gets 2 + 50 = 52 generated ids, one of 12 gets 62, and one of 14 would get 64 but
    max_seq_len 64 leaves 63 positions after BOS."""
    config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0,
                               src_vocab_size=9, tgt_vocab_size=9, max_seq_len=64)
    model = build("explicit", config)
    state = random_canonical(config)
    state["generator.bias"][[PAD, BOS, EOS]] = -1e4
    import_weights(model, state)
    model.eval()
    src = torch.randint(3, 9, (3, 14), generator=torch.Generator().manual_seed(0))
    src[0, 2:] = PAD
    src[1, 12:] = PAD
    best = beam_search(model, src, padding_mask(src, PAD), bos_id=BOS, eos_id=EOS, beam_size=2)
    generated = (best.tokens[:, 1:] != PAD).sum(dim=1)
    assert generated.tolist() == [52, 62, 63]
    assert best.tokens.shape == (3, 64) and not (best.tokens == EOS).any()


BAD_ARGUMENTS = [
    pytest.param(dict(beam_size=0), ValueError, "beam_size must be at least 1", id="beam-0"),
    pytest.param(dict(beam_size=-2), ValueError, "beam_size must be at least 1", id="beam-negative"),
    pytest.param(dict(beam_size=2.0), TypeError, "beam_size must be an int", id="beam-float"),
    pytest.param(dict(alpha=-0.1), ValueError, r"alpha must be finite and >= 0, got -0\.1",
                 id="alpha-negative"),
    pytest.param(dict(alpha=math.nan), ValueError, "alpha must be finite", id="alpha-nan"),
    pytest.param(dict(alpha="0.6"), TypeError, "alpha must be a number", id="alpha-str"),
    pytest.param(dict(max_len=0), ValueError, "max_len", id="max_len-zero"),
    pytest.param(dict(eos_id=0), ValueError, "eos_id.*pad_id", id="eos-is-pad"),
]


@pytest.mark.parametrize(("changes", "error", "match"), BAD_ARGUMENTS)
def test_bad_arguments_are_named(changes, error, match):
    model = build("explicit", TINY, seed=0).eval()
    src = torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(error, match=match):
        beam_search(model, src, **{"bos_id": BOS, "eos_id": EOS, **changes})
