"""Greedy decoding: its EOS and padding contract, its argument checks, the key/value cache used
where the model has one (the same tokens as full recompute), and from equal weights every
from-scratch variant's tokens equal the reference's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common.config import TransformerConfig
from common.masks import decoder_mask
from seq2seq.data import tasks
from seq2seq.search.greedy import greedy_decode
from tests.helpers import small_config
from variants import REFERENCE, build

PAD, BOS, EOS = 0, 1, 2


class ScriptedModel(nn.Module):
    """A stand-in with the interface whose next token is read from a script, not computed.

    At a prefix of length t, row b predicts ``script[b, t - 1]`` whatever the prefix holds, so
    the expected output of greedy decoding can be written down by hand. Records its calls.
    """

    def __init__(self, script: torch.Tensor, vocab_size: int = 8) -> None:
        super().__init__()
        self.config = TransformerConfig(d_model=vocab_size, n_heads=1, n_layers=1, d_ff=4,
                                        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size,
                                        max_seq_len=16, pad_id=PAD)
        self.script = script  # (B, K) the token each row emits at each step
        self.unused = nn.Parameter(torch.zeros(1))  # so the model has a device
        self.encode_calls, self.decode_calls = 0, []

    def encode(self, src, src_mask=None):
        self.encode_calls += 1
        return torch.zeros(src.shape[0], src.shape[1], self.config.d_model)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        self.decode_calls.append((tgt.clone(), tgt_mask))
        steps = self.script[:, : tgt.shape[1]]  # (B, T): position t predicts script[:, t]
        return F.one_hot(steps, self.config.tgt_vocab_size).double()  # (B, T, V)

    def project(self, hidden):
        return (10.0 * hidden).log_softmax(dim=-1)


def test_rows_stop_at_eos_and_then_hold_padding():
    script = torch.tensor([[5, EOS, 7, 7, 7, 7],
                           [6, 6, 6, EOS, 7, 7],
                           [EOS, 3, 3, 3, 3, 3]])
    model = ScriptedModel(script)
    src = torch.ones(3, 4, dtype=torch.long)
    tokens = greedy_decode(model, src, max_len=10, bos_id=BOS, eos_id=EOS)
    expected = torch.tensor([[BOS, 5, EOS, PAD, PAD],
                             [BOS, 6, 6, 6, EOS],
                             [BOS, EOS, PAD, PAD, PAD]])
    assert tokens.dtype == torch.long
    assert torch.equal(tokens, expected)  # stops once the last row has ended: L = 5 < max_len
    assert model.encode_calls == 1
    assert len(model.decode_calls) == 4


def test_each_step_decodes_the_whole_prefix_under_the_decoder_mask():
    script = torch.tensor([[4, EOS, 5], [EOS, 6, 6]])
    model = ScriptedModel(script)
    greedy_decode(model, torch.ones(2, 3, dtype=torch.long), max_len=5, bos_id=BOS, eos_id=EOS)
    prefixes = [tgt.tolist() for tgt, _ in model.decode_calls]
    assert prefixes == [[[BOS], [BOS]], [[BOS, 4], [BOS, EOS]]]
    for tgt, tgt_mask in model.decode_calls:
        assert torch.equal(tgt_mask, decoder_mask(tgt, PAD))


def test_max_len_cuts_rows_that_never_end():
    script = torch.tensor([[3, 4, 5, 6, 7, 3], [4, EOS, 5, 5, 5, 5]])
    model = ScriptedModel(script)
    tokens = greedy_decode(model, torch.ones(2, 3, dtype=torch.long), max_len=4, bos_id=BOS,
                           eos_id=EOS)
    assert torch.equal(tokens, torch.tensor([[BOS, 3, 4, 5], [BOS, 4, EOS, PAD]]))
    only_bos = greedy_decode(model, torch.ones(2, 3, dtype=torch.long), max_len=1, bos_id=BOS,
                             eos_id=EOS)
    assert torch.equal(only_bos, torch.tensor([[BOS], [BOS]]))


BAD_ARGUMENTS = [
    pytest.param(dict(max_len=0), ValueError, "max_len", id="max_len-zero"),
    pytest.param(dict(max_len=41), ValueError, "max_len", id="max_len-over-max_seq_len"),
    pytest.param(dict(max_len=5.0), TypeError, "max_len", id="max_len-float"),
    pytest.param(dict(bos_id=True), TypeError, "bos_id", id="bos_id-bool"),
    pytest.param(dict(bos_id=0), ValueError, "bos_id.*pad_id", id="bos_id-is-pad"),
    pytest.param(dict(eos_id=0), ValueError, "eos_id.*pad_id", id="eos_id-is-pad"),
    pytest.param(dict(eos_id=19), ValueError, "eos_id.*tgt_vocab_size", id="eos_id-out-of-vocab"),
    pytest.param(dict(bos_id=-1), ValueError, "bos_id", id="bos_id-negative"),
    pytest.param(dict(eos_id=1), ValueError, "bos_id and eos_id", id="bos-equals-eos"),
    pytest.param(dict(src=torch.ones(2, 5)), TypeError, "src", id="src-float"),
    pytest.param(dict(src=torch.ones(5, dtype=torch.long)), ValueError, "src", id="src-1d"),
    pytest.param(dict(src_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool)), ValueError, "src_mask",
                 id="src_mask-with-query-dim"),
    pytest.param(dict(src_mask=torch.ones(2, 1, 1, 5)), TypeError, "src_mask",
                 id="src_mask-not-bool"),
    pytest.param(dict(model=object()), TypeError, "model", id="model-not-a-module"),
    pytest.param(dict(use_cache=1), TypeError, "use_cache", id="use_cache-not-bool"),
]


@pytest.mark.parametrize(("changes", "error", "match"), BAD_ARGUMENTS)
def test_bad_arguments_are_named(changes, error, match):
    config = small_config()
    arguments = dict(model=build("torch", config, seed=0), src=torch.ones(2, 5, dtype=torch.long),
                     src_mask=None, max_len=6, bos_id=1, eos_id=2)
    arguments.update(changes)
    model, src, src_mask = arguments.pop("model"), arguments.pop("src"), arguments.pop("src_mask")
    with pytest.raises(error, match=match):
        greedy_decode(model, src, src_mask, **arguments)


@pytest.fixture(scope="module")
def reference_tokens(copy_model) -> torch.Tensor:
    """The reference's greedy tokens in float64 (by full recompute): the expected value."""
    tokens = greedy_decode(copy_model.build(REFERENCE, torch.float64), copy_model.src,
                           copy_model.src_mask, max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    ended = (tokens == tasks.EOS_ID).any(dim=1)
    lengths = (tokens != copy_model.config.pad_id).sum(dim=1)
    assert ended.any() and len(lengths.unique()) > 3, "a degenerate decoding would prove little"
    return tokens


def test_same_weights_same_tokens_as_the_reference(copy_model, subject_variant, reference_tokens):
    """float64, so that no near-tie between two logits can be broken differently. Each
    from-scratch variant decodes with its cache; the expected tokens are the reference's."""
    model = copy_model.build(subject_variant, torch.float64)
    tokens = greedy_decode(model, copy_model.src, copy_model.src_mask, max_len=10,
                           bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    assert torch.equal(tokens, reference_tokens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_cached_and_uncached_greedy_give_the_same_tokens(copy_model, subject_variant, dtype):
    """Every variant but the reference, which has no cache: both of its paths recompute."""
    model = copy_model.build(subject_variant, dtype)
    assert model.has_cache
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    cached = greedy_decode(model, copy_model.src, copy_model.src_mask, **arguments)
    uncached = greedy_decode(model, copy_model.src, copy_model.src_mask, use_cache=False, **arguments)
    assert torch.equal(cached, uncached)


def test_greedy_steps_with_the_cache_where_the_model_has_one(copy_model, variant, monkeypatch):
    """One decode_step per generated token and no full decode, where there is a cache; the
    reference, and use_cache=False, decode the whole prefix instead."""
    model = copy_model.build(variant)
    calls = {"decode": 0, "decode_step": 0}
    for method in calls:
        monkeypatch.setattr(model, method, counting(calls, method, getattr(model, method)))
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    tokens = greedy_decode(model, copy_model.src, copy_model.src_mask, **arguments)
    steps = tokens.shape[1] - 1
    assert calls == ({"decode": 0, "decode_step": steps} if model.has_cache
                     else {"decode": steps, "decode_step": 0})
    calls.update(decode=0, decode_step=0)
    greedy_decode(model, copy_model.src, copy_model.src_mask, use_cache=False, **arguments)
    assert calls == {"decode": steps, "decode_step": 0}


def counting(calls: dict[str, int], method: str, original):
    """``original``, counting its calls in ``calls[method]``."""
    def counted(*args):
        calls[method] += 1
        return original(*args)
    return counted
