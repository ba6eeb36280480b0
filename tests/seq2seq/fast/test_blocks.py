"""Choosing the next ids block by block (``seq2seq.fast.blocks``): its argmax is
``Tensor.argmax`` (first maximal entry, NaN the largest) and its k best extensions are
``seq2seq.search.beam.best_extensions``'s, bit for bit, on random rows, rows of many ties, rows
of -inf and beams not yet started; the static decoders on the CPU choose through it and still
give the teaching decoders' tokens and hypotheses; a flat cache's reorder, made layer by layer
when a step reads it, moves the rows a gather moves."""

from __future__ import annotations

import pytest
import torch

from common.random_batch import random_batch
from seq2seq.fast import blocks
from seq2seq.fast.blocks import MAX_BLOCK, MIN_BLOCK, argmax, best_extensions, block_size
from seq2seq.fast.flat import FlatDecoding
from seq2seq.fast.static_search import StaticBeam, StaticGreedy
from seq2seq.search import beam
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.helpers import FLOAT64_TOL, small_config
from variants import build

BLOCK = 64  # a block of the tests' own rows: V = 8 blocks of it


@pytest.mark.parametrize("vocab", [37000, 32000, 512, 4096, 2 * 1009, 1009, 300, 19])
def test_the_block_is_the_largest_divisor_in_range_leaving_two_blocks(vocab):
    size = block_size(vocab)
    divisors = [d for d in range(MIN_BLOCK, MAX_BLOCK + 1) if vocab % d == 0 and vocab // d >= 2]
    assert size == (max(divisors) if divisors else None)


def test_the_base_vocabulary_splits_into_blocks_of_a_thousand():
    assert block_size(37000) == 1000 and block_size(1009) is None and block_size(19) is None


def integer_rows(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Rows of small integers: every row's maximum is tied many times."""
    return torch.randint(-5, 5, (rows, vocab), generator=torch.Generator().manual_seed(seed)).float()


@pytest.mark.parametrize("block", [BLOCK, None], ids=["block-64", "default-block"])
def test_argmax_is_tensor_argmax(block):
    generator = torch.Generator().manual_seed(0)
    vocab = 8 * BLOCK if block else 4096
    rows = torch.randn(16, vocab, generator=generator)
    assert torch.equal(argmax(rows, block), rows.argmax(dim=-1))
    tied = integer_rows(16, vocab, seed=1)  # the first of the tied maxima, in a block not the first
    assert torch.equal(argmax(tied, block), tied.argmax(dim=-1))
    special = torch.randn(4, vocab, generator=generator)
    special[0] = -torch.inf  # no finite entry: the first
    special[1, [5, vocab - 3]] = torch.nan  # NaN counts as the largest: its first
    special[2, vocab - 1] = torch.inf  # the very last entry
    special[3, :] = 0.0  # all tied
    assert argmax(special, block).tolist() == special.argmax(dim=-1).tolist() == [0, 5, vocab - 1, 0]


def test_argmax_of_a_vocabulary_without_a_block_is_tensor_argmax():
    rows = torch.randn(5, 1009, generator=torch.Generator().manual_seed(2))
    assert torch.equal(argmax(rows), rows.argmax(dim=-1))


def beams(batch: int, k: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, k) live log P in ``dtype`` and (B, k, V) float32 log-probabilities, as a step gives them."""
    generator = torch.Generator().manual_seed(seed)
    scores = -torch.rand(batch, k, generator=generator, dtype=torch.float64).mul(20).to(dtype)
    logp = torch.randn(batch, k, vocab, generator=generator).log_softmax(dim=-1)
    return scores, logp


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 4, 5])
def test_best_extensions_are_the_searchs_bit_for_bit(dtype, k):
    scores, logp = beams(6, k, 8 * BLOCK, seed=k, dtype=dtype)
    scores[0, 1:] = -torch.inf  # a source at its first step: one live beam
    scores[1, : k - 1] = -torch.inf  # a source with one live beam left (the others ended)
    found, expected = best_extensions(scores, logp, BLOCK), beam.best_extensions(scores, logp)
    assert found[0].dtype == expected[0].dtype == dtype
    assert torch.equal(found[0], expected[0]) and torch.equal(found[1], expected[1])


def test_best_extensions_of_the_base_vocabulary_by_its_default_block():
    scores, logp = beams(8, 4, 37000, seed=3)
    found, expected = best_extensions(scores, logp), beam.best_extensions(scores, logp)
    assert torch.equal(found[0], expected[0]) and torch.equal(found[1], expected[1])


def assert_valid_extensions(found: tuple[torch.Tensor, torch.Tensor], scores: torch.Tensor,
                            logp: torch.Tensor, expected_top: torch.Tensor) -> None:
    """The values are the k best sums; each index is distinct in its row and holds its value."""
    top, index = found
    batch, k, vocab = logp.shape
    assert torch.equal(top, expected_top)
    sums = (scores[:, :, None] + logp).view(batch, k * vocab)  # (B, k·V), an independent sum
    assert torch.equal(sums.gather(1, index), top)
    assert all(len(set(row)) == k for row in index.tolist())


def test_tied_extensions_have_the_best_values_at_distinct_indices():
    """Integer log-probabilities: the k-th value is tied across blocks and beams; which tied
    index comes first is not specified, by topk or by blocks."""
    scores = torch.tensor([[0.0, -1.0, -1.0], [0.0, 0.0, 0.0]])  # (B, k = 3)
    logp = integer_rows(6, 8 * BLOCK, seed=4).view(2, 3, -1)
    found = best_extensions(scores, logp, BLOCK)
    assert_valid_extensions(found, scores, logp, beam.best_extensions(scores, logp)[0])


def test_sources_whose_beams_are_all_dead_get_distinct_indices():
    scores, logp = beams(3, 4, 8 * BLOCK, seed=5)
    scores[1] = -torch.inf  # done: every extension -inf
    found = best_extensions(scores, logp, BLOCK)
    assert_valid_extensions(found, scores, logp, beam.best_extensions(scores, logp)[0])
    assert torch.isinf(found[0][1]).all()


def test_best_extensions_without_a_block_are_the_searchs():
    scores, logp = beams(3, 4, 19, seed=6)
    assert block_size(19) is None
    found, expected = best_extensions(scores, logp), beam.best_extensions(scores, logp)
    assert torch.equal(found[0], expected[0]) and torch.equal(found[1], expected[1])


def blocked_fused() -> torch.nn.Module:
    """float64 fused with a target vocabulary of 2 blocks (512 = 2 x 256): the decoders choose
    block by block."""
    config = small_config(dropout=0.0, tgt_vocab_size=512)
    assert block_size(config.tgt_vocab_size) == 256
    return build("fused", config, seed=0).double().eval()


@pytest.mark.parametrize("flat", [False, True], ids=["static-step", "flat"])
def test_static_decoders_choose_by_blocks_and_find_the_teaching_decoders_results(flat, monkeypatch):
    model = blocked_fused()
    src, _, src_mask, _ = random_batch(model.config, 5, 6, 2).inputs()
    arguments = dict(max_len=10, bos_id=1, eos_id=2)
    calls = {"argmax": 0, "best_extensions": 0}
    for name in calls:
        chosen = getattr(blocks, name)

        def counted(*args, name=name, chosen=chosen):
            calls[name] += 1
            return chosen(*args)
        monkeypatch.setattr(blocks, name, counted)
    tokens = StaticGreedy(model, flat=flat, **arguments)(src, src_mask)
    assert torch.equal(tokens, greedy_decode(model, src, src_mask, **arguments))
    best = StaticBeam(model, flat=flat, **arguments)(src, src_mask)
    expected = beam_search(model, src, src_mask, **arguments)
    assert torch.equal(best.tokens, expected.tokens)
    torch.testing.assert_close(best.scores, expected.scores, **FLOAT64_TOL)
    assert calls["argmax"] == tokens.shape[1] - 1 and calls["best_extensions"] > 1


def started_flat_cache(beams_per_source: int = 3):
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    flat = FlatDecoding(model)
    src, _, src_mask, _ = random_batch(model.config, 2, 5, 2).inputs()
    with torch.no_grad():
        cache = flat.start_static_cache(model.encode(src, src_mask), src_mask, 8, beams=beams_per_source)
    generator = torch.Generator().manual_seed(7)
    for buffers in (cache.keys, cache.values):
        for buffer in buffers:
            buffer.copy_(torch.randn(buffer.shape, generator=generator))
    cache.self_bias.copy_(torch.randn(cache.self_bias.shape, generator=generator))
    return cache


def test_a_reorder_moves_each_layers_rows_when_it_is_read():
    """The mask's written slots move at once, each layer's keys and values when ``layer`` reads
    them; the slots after ``written`` are not read before a step writes them."""
    cache = started_flat_cache()
    keys, values = [buffer.clone() for buffer in cache.keys], [buffer.clone() for buffer in cache.values]
    bias = cache.self_bias.clone()
    rows = [2, 2, 0, 4, 3, 3]  # each row continues a row of its own source (2 sources x 3 beams)
    origin = torch.tensor(rows)
    cache.reorder_beams(origin, written=5)
    origin.fill_(0)  # the caller's buffer, refilled before the step: the reorder kept its own
    assert torch.equal(cache.self_bias[..., :5], bias[rows][..., :5])
    assert torch.equal(cache.self_bias[..., 5:], bias[..., 5:])
    for index in range(len(keys)):
        found_keys, found_values = cache.layer(index)
        assert torch.equal(found_keys[:, :, :5], keys[index][rows][:, :, :5])
        assert torch.equal(found_values[:, :, :5], values[index][rows][:, :, :5])
    assert cache.pending is None


def test_a_second_reorder_before_a_step_composes_with_the_first():
    """Two reorders with no step between: every layer makes the first before the second."""
    cache = started_flat_cache()
    keys = [buffer.clone() for buffer in cache.keys]
    first, second = torch.tensor([1, 0, 2, 5, 5, 3]), torch.tensor([0, 0, 1, 4, 3, 3])
    cache.reorder_beams(first, written=8)
    cache.layer(0)  # layer 0 has made the first, the others not yet
    cache.reorder_beams(second, written=8)
    for index, old in enumerate(keys):
        assert torch.equal(cache.layer(index)[0], old[first][second])
    assert cache.pending is None
