"""Beam search against scripted models: every row's own encoder, decoder and cache, with
next-token log-probabilities chosen by the test, so that the documented rules and plausible
wrong ones give different answers.

The rules (seq2seq/search/beam.py, docs/decoding.md): a hypothesis that has emitted EOS is finished —
it never grows and its score never changes; a source is done when no live hypothesis can beat
its best finished one even at the length penalty of the longest length it could still reach;
scores are log P(Y) / ((5 + |Y|) / 6)^α with |Y| counting EOS; beam 1 is greedy; ``max_len=1``
leaves room for BOS alone, the empty hypothesis, scored log 1 / lp(0) = 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from common.config import TransformerConfig
from common.masks import padding_mask
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from variants import FROM_SCRATCH, REFERENCE, build

PAD, BOS, EOS = 0, 1, 2
X, Y, Z = 3, 4, 5  # the ordinary target ids
VOCAB = 6
CONFIG = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=16, dropout=0.0, src_vocab_size=7,
                           tgt_vocab_size=VOCAB, max_seq_len=8)
# two sources of 3 and 2 real ids: a script is chosen by the number of real ids of a row's source
SOURCES = torch.tensor([[5, 6, 3], [4, 5, PAD]])
LONG, SHORT = 3, 2
# every row with a cache steps with it; the reference decodes by full recompute
ROWS = [*FROM_SCRATCH, REFERENCE]


def lp(length: int, alpha: float = 0.6) -> float:
    """Wu et al.'s length penalty, written here from the docs: ((5 + |Y|) / 6)^α."""
    return ((5 + length) / 6) ** alpha


@dataclass(frozen=True)
class Script:
    """Next-token probabilities by prefix (the ids after BOS). The mass a prefix's entry leaves
    over is shared equally by the ids it does not name; an unscripted prefix shares all of it."""

    steps: dict[tuple[int, ...], dict[int, float]]

    def log_probs(self, prefix: tuple[int, ...]) -> Tensor:
        chosen = self.steps.get(prefix, {})
        rest = (1.0 - sum(chosen.values())) / (VOCAB - len(chosen))
        assert rest > 0, prefix  # every id keeps a finite log-probability
        probs = torch.full((VOCAB,), rest, dtype=torch.float64)  # (V,)
        for token, prob in chosen.items():
            probs[token] = prob
        return probs.log()


class Scripted(nn.Module):
    """A row whose next-token log-probabilities come from a script, not from its weights.

    ``encode``, ``decode``, ``start_cache`` and ``decode_step`` are the row's own, so beam search
    expands and reorders a real cache. ``project`` ignores the hidden state: for each row it
    returns the script of that row's source at that row's prefix, both read from what the last
    decode saw — the source mask and ids the cache carries (which ``reorder`` permutes), or
    ``decode``'s mask and target. A wrong reorder therefore reads the wrong script or prefix.
    """

    def __init__(self, row: nn.Module, scripts: dict[int, Script]) -> None:
        super().__init__()
        self.row = row
        self.config = row.config
        self.scripts = scripts  # real source ids -> that source's script
        self.steps = 0  # project calls: one per beam step
        self._seen: tuple[Tensor, Tensor] | None = None  # (rows,) source lengths, (rows, L) ids

    @property
    def has_cache(self) -> bool:
        return self.row.has_cache

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.row.encode(src, src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None) -> Tensor:
        self._seen = (src_mask.flatten(1).sum(dim=1), tgt)
        return self.row.decode(tgt, memory, src_mask, tgt_mask)

    def start_cache(self, memory: Tensor, src_mask: Tensor | None = None):
        return self.row.start_cache(memory, src_mask)

    def decode_step(self, tgt: Tensor, cache) -> Tensor:
        hidden = self.row.decode_step(tgt, cache)
        self._seen = (cache.src_mask.flatten(1).sum(dim=1), cache.tokens)
        return hidden

    def project(self, hidden: Tensor) -> Tensor:
        self.steps += 1
        lengths, prefixes = self._seen
        rows = [self.scripts[int(n)].log_probs(tuple(ids[1:].tolist())) for n, ids in zip(lengths, prefixes,
                                                                                             strict=True)]
        return torch.stack(rows)[:, None, :].to(hidden.dtype)  # (B, 1, V)


@pytest.fixture(scope="module")
def rows() -> dict[str, nn.Module]:
    return {name: build(name, CONFIG, seed=0).double().eval() for name in ROWS}


def search(model: Scripted, batch: slice = slice(None), **options):
    src = SOURCES[batch]
    return beam_search(model, src, padding_mask(src, PAD), bos_id=BOS, eos_id=EOS, **options)


# A source whose most likely first id is EOS, and whose model, asked to go on after EOS, would
# put almost all its mass on EOS again: a search that kept [EOS] live would find [EOS, EOS]
# scoring better, (log .6 + log .99) / lp(2) > log .6 / lp(1).
EOS_FIRST = Script({(): {EOS: 0.6, X: 0.3}, (EOS,): {EOS: 0.99}, (X,): {EOS: 0.5}})
# Stopping: [EOS] scores log p_e / lp(1) = -1 at once; [X, X, X, EOS] scores
# (-1.25 + 3 log .999) / lp(4) = -0.982 at the limit (max_len 5: 4 generated ids). After the first
# step live [X] has log P -1.25: over lp(1), lp(2) or lp(3) that is below -1, over lp(4) above.
LATE_WINNER = Script({(): {EOS: math.exp(-1.0), X: math.exp(-1.25)}, (X,): {X: 0.999},
                      (X, X): {X: 0.999}, (X, X, X): {EOS: 0.999}})


@pytest.mark.parametrize("row", ROWS)
def test_a_finished_hypothesis_never_grows_or_changes_score(rows, row):
    """EOS at the first step: [EOS] is final, while the other source keeps the search running."""
    model = Scripted(rows[row], {LONG: EOS_FIRST, SHORT: LATE_WINNER})
    assert (math.log(0.6) + math.log(0.99)) / lp(2) > math.log(0.6) / lp(1)  # keeping it live would win
    best = search(model, max_len=5, beam_size=2)
    assert best.tokens[0].tolist() == [BOS, EOS, PAD, PAD, PAD]
    assert best.scores[0].item() == pytest.approx(math.log(0.6), abs=1e-12, rel=0)  # lp(1) = 1
    assert best.tokens[1].tolist() == [BOS, X, X, X, EOS]
    assert model.steps == 4


@pytest.mark.parametrize("row", ROWS)
def test_a_live_beam_is_bounded_at_the_longest_length_it_can_reach(rows, row):
    """Stopping once no live beam beats the best finished one over the current length's penalty
    (or any penalty short of the limit's) loses the optimum; the rule keeps searching."""
    model = Scripted(rows[row], {LONG: LATE_WINNER})
    finished, live = -1.0, -1.25  # log P of [EOS] and of live [X] after the first step
    assert all(finished / lp(1) >= live / lp(length) for length in (1, 2, 3))
    assert finished / lp(1) < live / lp(4)
    best = search(model, slice(0, 1), max_len=5, beam_size=2)
    assert best.tokens.tolist() == [[BOS, X, X, X, EOS]]
    expected = (-1.25 + 3 * math.log(0.999)) / lp(4)
    assert expected > finished
    assert best.scores.item() == pytest.approx(expected, abs=1e-12, rel=0)
    assert model.steps == 4


@pytest.mark.parametrize("row", ROWS)
def test_the_search_stops_at_the_first_step_no_live_beam_can_win(rows, row):
    """After step 1 live [X] could still win (-1.2 / lp(4) > -1); after step 2 its best
    extension [X, X] could not ((-1.2 + log .3) / lp(4) < -1): the search ends there."""
    script = Script({(): {EOS: math.exp(-1.0), X: math.exp(-1.2)}, (X,): {EOS: 0.5, X: 0.3}})
    model = Scripted(rows[row], {LONG: script})
    assert -1.2 / lp(4) > -1.0 > (-1.2 + math.log(0.3)) / lp(4)
    assert (-1.2 + math.log(0.5)) / lp(2) < -1.0  # [X, EOS] finishes, worse than [EOS]
    best = search(model, slice(0, 1), max_len=5, beam_size=2)
    assert best.tokens.tolist() == [[BOS, EOS]]
    assert best.scores.item() == pytest.approx(-1.0, abs=1e-12, rel=0)
    assert model.steps == 2


@pytest.mark.parametrize("row", ROWS)
def test_every_beam_finishing_at_once_ends_the_source(rows, row):
    """Both beams of the long source end with EOS at step 2 (the best of its extensions); the
    short source decodes on, and the long one's best stays as it was."""
    both_end = Script({(): {X: 0.5, Y: 0.4}, (X,): {EOS: 0.9}, (Y,): {EOS: 0.95}})
    model = Scripted(rows[row], {LONG: both_end, SHORT: LATE_WINNER})
    best = search(model, max_len=5, beam_size=2)
    assert best.tokens.tolist() == [[BOS, X, EOS, PAD, PAD], [BOS, X, X, X, EOS]]
    expected = [math.log(0.5 * 0.9) / lp(2), (-1.25 + 3 * math.log(0.999)) / lp(4)]
    assert best.scores.tolist() == pytest.approx(expected, abs=1e-12, rel=0)
    alone = Scripted(rows[row], {LONG: both_end})
    assert search(alone, slice(0, 1), max_len=5, beam_size=2).tokens.tolist() == [[BOS, X, EOS]]
    assert alone.steps == 2


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("row", ROWS)
def test_the_length_penalty_picks_the_hypothesis_computed_by_hand(rows, row, alpha):
    """[EOS] (log P -1, |Y| 1) against [X, X, X, EOS] (log P -1.25 + 3 log .999, |Y| 4, EOS
    counted): α = 0 keeps the short one, 0.6 and 1 the long one, with these scores."""
    model = Scripted(rows[row], {LONG: LATE_WINNER})
    best = search(model, slice(0, 1), max_len=5, beam_size=2, alpha=alpha)
    long_score = (-1.25 + 3 * math.log(0.999)) / (9 / 6) ** alpha
    expected = {0.0: ([BOS, EOS], -1.0), 0.6: ([BOS, X, X, X, EOS], long_score),
                1.0: ([BOS, X, X, X, EOS], long_score)}[alpha]
    assert best.tokens.tolist() == [expected[0]]
    assert best.scores.item() == pytest.approx(expected[1], abs=1e-12, rel=0)


@pytest.mark.parametrize("row", ROWS)
def test_beam_of_one_is_greedy(rows, row):
    """Greedy takes X, Y, EOS for the long source and EOS for the short; a beam of two finds
    the short source's better [X, X, X, EOS]."""
    script = Script({(): {X: 0.5, Y: 0.4}, (X,): {Y: 0.4, Z: 0.35}, (X, Y): {EOS: 0.6}})
    scripts = {LONG: script, SHORT: LATE_WINNER}
    greedy = greedy_decode(Scripted(rows[row], scripts), SOURCES, padding_mask(SOURCES, PAD),
                           max_len=5, bos_id=BOS, eos_id=EOS)
    assert greedy.tolist() == [[BOS, X, Y, EOS], [BOS, EOS, PAD, PAD]]
    one = search(Scripted(rows[row], scripts), max_len=5, beam_size=1)
    assert torch.equal(one.tokens, greedy)
    assert one.scores.tolist() == pytest.approx([math.log(0.5 * 0.4 * 0.6) / lp(3), -1.0], abs=1e-12, rel=0)
    two = search(Scripted(rows[row], scripts), max_len=5, beam_size=2)
    assert two.tokens[1].tolist() == [BOS, X, X, X, EOS]


@pytest.mark.parametrize("row", ROWS)
def test_max_len_one_is_bos_alone_and_two_is_one_id_cut_at_the_limit(rows, row):
    """max_len counts BOS: 1 leaves the empty hypothesis, log 1 / lp(0) = 0, without a step;
    2 ends every extension at the limit, so the most likely id wins whether or not it is EOS."""
    model = Scripted(rows[row], {LONG: EOS_FIRST, SHORT: LATE_WINNER})
    empty = search(model, max_len=1)
    assert empty.tokens.tolist() == [[BOS], [BOS]]
    assert empty.scores.tolist() == [0.0, 0.0]
    assert model.steps == 0
    assert torch.equal(empty.tokens, greedy_decode(model, SOURCES, padding_mask(SOURCES, PAD), max_len=1,
                                                   bos_id=BOS, eos_id=EOS))
    model = Scripted(rows[row], {LONG: Script({(): {X: 0.5, EOS: 0.3}}), SHORT: EOS_FIRST})
    one = search(model, max_len=2)
    assert one.tokens.tolist() == [[BOS, X], [BOS, EOS]]
    assert one.scores.tolist() == pytest.approx([math.log(0.5), math.log(0.6)], abs=1e-12, rel=0)
