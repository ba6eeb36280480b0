"""The fast decoding path: beam search on fused's static step (``StaticBeam``) finds
``beam_search``'s hypotheses and scores, and the static path compiled with inductor freezing
decodes ``greedy_decode``'s tokens and ``beam_search``'s hypotheses. The expected values are the
eager decoders' on the growing cache, an independent implementation of the same search."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.masks import padding_mask
from common.random_batch import random_batch
from seq2seq.data import tasks
from seq2seq.fast.static_search import StaticBeam, StaticGreedy, static_beam_search
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.helpers import FLOAT64_TOL, small_config
from variants import build

BOS = 1


def random_fused(norm_first: bool) -> tuple[nn.Module, torch.Tensor, torch.Tensor, int]:
    """A float64 fused model of random weights, a padded batch of 8 sources, and the EOS id at
    which ``beam_search`` (the expected side) ends its hypotheses at the most different lengths,
    so rows finish at different steps (and others run to the length limit)."""
    config = small_config(dropout=0.0, norm_first=norm_first)
    model = build("fused", config, seed=0).double().eval()
    src, _, src_mask, _ = random_batch(config, 8, 6, 2).inputs()

    def end_lengths(eos: int) -> int:
        tokens = beam_search(model, src, src_mask, max_len=12, bos_id=BOS, eos_id=eos).tokens
        ended = (tokens == eos).any(dim=1)
        return len((tokens == eos).float().argmax(dim=1)[ended].unique())

    eos = max(range(BOS + 1, config.tgt_vocab_size), key=end_lengths)
    return model, src, src_mask, eos


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
def test_static_beam_finds_beam_searchs_hypotheses_in_float64(norm_first):
    model, src, src_mask, eos = random_fused(norm_first)
    assert (src == 0).any(), "the sources should hold padding"
    arguments = dict(max_len=12, bos_id=BOS, eos_id=eos)
    expected = beam_search(model, src, src_mask, **arguments)
    ended = (expected.tokens == eos).any(dim=1)
    ends = (expected.tokens == eos).float().argmax(dim=1)[ended]
    assert len(ends.unique()) >= 2 and not ended.all(), "rows should finish at different steps"
    found = static_beam_search(model, src, src_mask, **arguments)
    assert torch.equal(found.tokens, expected.tokens)
    torch.testing.assert_close(found.scores, expected.scores, **FLOAT64_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_static_beam_on_the_copy_model(copy_model, dtype):
    """The trained copy model: its hypotheses end with EOS at many lengths; beams of 4 and 2,
    and a second batch of the same shape through the same decoder (its cache refilled)."""
    model = copy_model.build("fused", dtype)
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    first, second = copy_model.src[:32], copy_model.src[32:]
    for beam_size in (4, 2):
        decode = StaticBeam(model, beam_size=beam_size, **arguments)
        for src in (first, second):
            expected = beam_search(model, src, padding_mask(src, 0), beam_size=beam_size, **arguments)
            lengths = (expected.tokens != 0).sum(dim=1)
            assert len(lengths.unique()) > 3
            found = decode(src, padding_mask(src, 0))
            assert torch.equal(found.tokens, expected.tokens)
            torch.testing.assert_close(found.scores, expected.scores)


def test_static_beam_refuses_bad_arguments_by_name():
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    with pytest.raises(ValueError, match=r"beam_size must be .*1"):
        StaticBeam(model, max_len=8, bos_id=BOS, eos_id=2, beam_size=0)
    with pytest.raises(ValueError, match="alpha"):
        StaticBeam(model, max_len=8, bos_id=BOS, eos_id=2, alpha=-1.0)
    with pytest.raises(TypeError, match="max_len must be an int"):
        StaticBeam(model, max_len=None, bos_id=BOS, eos_id=2)
    decode = StaticBeam(model, max_len=8, bos_id=BOS, eos_id=2)
    src = torch.tensor([[3, 4, 0], [0, 0, 0]])
    with pytest.raises(ValueError, match="hides every position of source row 1"):
        decode(src, padding_mask(src, 0))


# --- compiled with inductor freezing: what compare.py's "inductor" row runs ----------------

@pytest.mark.slow
@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
def test_frozen_compiled_decoders_give_the_eager_tokens(copy_model, norm_first):
    """float32, the copy model (post-norm) or random pre-norm weights in float64: the frozen
    compiled greedy decoder gives ``greedy_decode``'s tokens and the frozen compiled beam
    ``beam_search``'s hypotheses, on two batches of one shape (the graph reused)."""
    if norm_first:
        model, src, src_mask, eos = random_fused(norm_first)
        batches, bos = [(src, src_mask), (src.flip(0), src_mask.flip(0))], BOS
    else:
        model, eos, bos = copy_model.build("fused", torch.float32), tasks.EOS_ID, tasks.BOS_ID
        batches = [(src, padding_mask(src, 0)) for src in (copy_model.src[:32], copy_model.src[32:])]
    arguments = dict(max_len=10, bos_id=bos, eos_id=eos)
    greedy = StaticGreedy(model, compile_mode="default", freezing=True, **arguments)
    beam = StaticBeam(model, compile_mode="default", freezing=True, **arguments)
    for src, src_mask in batches:
        assert torch.equal(greedy(src, src_mask), greedy_decode(model, src, src_mask, **arguments))
        expected = beam_search(model, src, src_mask, **arguments)
        found = beam(src, src_mask)
        assert torch.equal(found.tokens, expected.tokens)
        torch.testing.assert_close(found.scores, expected.scores)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("freezing", [False, True], ids=["live", "frozen"])
def test_on_cuda_the_static_beam_as_a_cuda_graph_finds_beam_searchs_hypotheses(copy_model, freezing):
    model = copy_model.build("fused").cuda()
    src, src_mask = copy_model.src.cuda(), copy_model.src_mask.cuda()
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    expected = beam_search(model, src, src_mask, **arguments)
    decode = StaticBeam(model, compile_mode="reduce-overhead", freezing=freezing, **arguments)
    for _ in range(3):  # reduce-overhead records its graph on a later call than the first
        found = decode(src, src_mask)
        assert torch.equal(found.tokens, expected.tokens)
        torch.testing.assert_close(found.scores, expected.scores)
