"""The flat step of the fast decoding path (``seq2seq.fast.flat``): fused's decoder step written
as one function over its weights, keys and values heads first. Its log-probs are the growing
cache's ``decode_step``'s at every position (an independent implementation: the teaching step
through SDPA) under every architecture switch a decoder layer reads, padded targets, per-head
source masks and a source with no open key; its decoders give ``greedy_decode``'s tokens and
``beam_search``'s hypotheses; on the int8 copy it computes the int8 step; refused by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.random_batch import random_batch
from seq2seq.data import tasks
from seq2seq.fast.flat import FlatCache, FlatDecoding
from seq2seq.fast.int8 import Int8Linear, int8_available, with_int8_linears
from seq2seq.fast.onednn import OneDnnLinear, with_onednn_linears
from seq2seq.fast.static_search import StaticBeam, StaticGreedy, StaticNextToken, static_beam_search
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.helpers import FLOAT64_TOL, small_config
from tests.seq2seq.fast.test_static_beam import random_fused
from variants import build

PAD = 0


def fused64(**changes) -> nn.Module:
    return build("fused", small_config(dropout=0.0, **changes), seed=0).double().eval()


def assert_steps_match(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None,
                       max_len: int = 12) -> None:
    """The flat step's log-probs against ``decode_step``'s, position by position (float64)."""
    flat = FlatDecoding(model).eval()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        growing = model.start_cache(memory, src_mask)
        cache = flat.start_static_cache(memory, src_mask, max_len)
        for t in range(tgt.shape[1]):
            found = model.project(flat.static_step(tgt[:, t : t + 1], torch.tensor(t), cache))
            expected = model.project(model.decode_step(tgt[:, t : t + 1], growing))
            torch.testing.assert_close(found, expected, **FLOAT64_TOL)


@pytest.mark.parametrize("changes", [dict(), dict(norm_first=True), dict(activation="gelu"),
                                     dict(final_norm=False), dict(norm_first=True, final_norm=False)],
                         ids=["post", "pre", "gelu", "no-final-norm", "pre-no-final-norm"])
@pytest.mark.parametrize("masked", [True, False], ids=["padded-source", "no-mask"])
def test_the_flat_step_is_the_cached_step_at_every_position(changes, masked):
    """Padded sources and targets that hold padding after their end (S = 6, T = 9): a padded
    target slot must not count for the later positions."""
    model = fused64(**changes)
    src, tgt, src_mask, _ = random_batch(model.config, 3, 6, 9).inputs()
    assert (src == PAD).any() and (tgt[:, 1:] == PAD).any(), "the batch should hold padding"
    assert_steps_match(model, src, tgt, src_mask if masked else None)


def test_per_head_source_masks_and_a_source_with_no_open_key():
    """A (B, H, 1, S) mask that closes different keys per head, one source whose every key is
    closed and one head of another closed everywhere: fused attends uniformly there (the mean of
    V), and so must the flat step."""
    model = fused64()
    heads = model.config.n_heads
    src, tgt, _, _ = random_batch(model.config, 3, 6, 7).inputs()
    generator = torch.Generator().manual_seed(0)
    src_mask = torch.rand(3, heads, 1, 6, generator=generator) > 0.4  # (B, H, 1, S)
    src_mask[0] = False  # source 0: no key at all
    src_mask[1, 2] = False  # source 1: head 2 has none
    src_mask[2, :, :, 0] = True  # source 2: every head one key at least
    assert src_mask[2].any(dim=-1).all()
    assert_steps_match(model, src, tgt, src_mask)


def test_static_greedy_on_the_flat_step_gives_greedy_decodes_tokens(copy_model):
    """The trained copy model, float32: decodings ending with EOS at many lengths."""
    model = copy_model.build("fused", torch.float32)
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    expected = greedy_decode(model, copy_model.src, copy_model.src_mask, **arguments)
    assert len((expected != copy_model.config.pad_id).sum(dim=1).unique()) > 3
    decode = StaticGreedy(model, flat=True, **arguments)
    assert torch.equal(decode(copy_model.src, copy_model.src_mask), expected)
    # a second batch through the same decoder: a fresh cache, the same tokens
    assert torch.equal(decode(copy_model.src, copy_model.src_mask), expected)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
def test_static_beam_on_the_flat_step_finds_beam_searchs_hypotheses(norm_first):
    """float64, padded sources, rows that finish at different steps: every beam's cache rows
    move with it (``FlatCache.reorder_beams``)."""
    model, src, src_mask, eos = random_fused(norm_first)
    arguments = dict(max_len=12, bos_id=1, eos_id=eos)
    expected = beam_search(model, src, src_mask, **arguments)
    found = static_beam_search(model, src, src_mask, **arguments, flat=True)
    assert torch.equal(found.tokens, expected.tokens)
    torch.testing.assert_close(found.scores, expected.scores, **FLOAT64_TOL)


def test_the_beam_decoder_on_the_copy_model(copy_model):
    model = copy_model.build("fused", torch.float32)
    arguments = dict(max_len=10, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID, beam_size=3)
    expected = beam_search(model, copy_model.src, copy_model.src_mask, **arguments)
    found = StaticBeam(model, flat=True, **arguments)(copy_model.src, copy_model.src_mask)
    assert torch.equal(found.tokens, expected.tokens)
    torch.testing.assert_close(found.scores, expected.scores)


@pytest.mark.skipif(not int8_available(), reason="needs PyTorch's fbgemm quantized engine (x86)")
def test_on_the_int8_copy_the_flat_step_picks_the_int8_steps_tokens(copy_model):
    """The same int8 linears, fed the same prefixes. The two steps round attention differently,
    and an int8 product may turn a float32 rounding difference in its input into a whole input
    step, so their log-probs are not compared digit by digit: wherever the standard int8 step's
    best token leads the next by more than MARGIN (far above what one input step moves a
    log-prob in this model), the flat step must pick that token too."""
    margin = 0.5
    quantized = with_int8_linears(copy_model.build("fused", torch.float32))
    # no source mask: the flat encoder then encodes every token as fused does; on a padded batch
    # it skips the padding, whose activations no longer count in an int8 input's range
    tokens = greedy_decode(quantized, copy_model.src, None, max_len=10,
                           bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID)
    found, expected = (StaticNextToken(quantized, 10, flat=flat) for flat in (True, False))
    checked = 0
    with torch.no_grad():
        for step in (found, expected):
            step.start(copy_model.src, None)
        for length in range(1, tokens.shape[1]):
            flat_logp, logp = found(tokens[:, :length]), expected(tokens[:, :length])  # (B, V)
            top = logp.topk(2, dim=-1).values  # (B, 2)
            clear = top[:, 0] - top[:, 1] > margin  # (B,)
            assert torch.equal(flat_logp[clear].argmax(dim=-1), logp[clear].argmax(dim=-1)), length
            checked += int(clear.sum())
    assert checked > tokens.shape[0], "most steps of a trained copy model should be clear"


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
def test_the_flat_encoder_encodes_the_open_tokens_as_fused_does(norm_first):
    """A padded batch (row r holds r padding tokens): the memory at every open token is fused's,
    computed from the open tokens alone; zero at the padding."""
    model = fused64(norm_first=norm_first)
    src, _, src_mask, _ = random_batch(model.config, 4, 7, 2).inputs()
    keep = src_mask[:, 0, 0, :]  # (B, S)
    assert not keep.all() and keep.any(dim=1).all()
    with torch.no_grad():
        found = FlatDecoding(model).encode(src, src_mask)
        expected = model.encode(src, src_mask)
    torch.testing.assert_close(found[keep], expected[keep], **FLOAT64_TOL)
    assert (found[~keep] == 0).all()


def test_the_flat_encoder_is_fuseds_where_skipping_tokens_would_change_a_decoder_output():
    """No mask, a mask that closes nothing, per-head masks, and a source with no open key (it
    attends to every key, closed ones included): the model's own encode, bit for bit."""
    model = fused64()
    flat = FlatDecoding(model)
    src, _, src_mask, _ = random_batch(model.config, 3, 6, 2).inputs()
    heads = src_mask.expand(-1, model.config.n_heads, -1, -1).clone()  # (B, H, 1, S)
    heads[0, 1] = True
    no_key = src_mask.clone()
    no_key[1] = False
    with torch.no_grad():
        for mask in (None, torch.ones_like(src_mask), heads, no_key):
            assert torch.equal(flat.encode(src, mask), model.encode(src, mask))


def test_bad_flat_settings_are_refused_by_name():
    model = fused64().float()
    with pytest.raises(TypeError, match="flat must be a bool"):
        StaticGreedy(model, max_len=5, bos_id=1, eos_id=2, flat=1)
    with pytest.raises(ValueError, match="flat runs the step eagerly"):
        StaticBeam(model, max_len=5, bos_id=1, eos_id=2, flat=True, compile_mode="default")
    explicit = build("explicit", small_config(dropout=0.0), seed=0)
    with pytest.raises(ValueError, match=r"a flat step serves the fused row .*has no .*qkv_proj"):
        FlatDecoding(explicit)
    with pytest.raises(ValueError, match=r"serves the fused row .*has no encoder and no decoder layers"):
        FlatDecoding(nn.Linear(2, 2))


def test_the_flat_step_refuses_training_mode_and_a_cache_it_did_not_start():
    """It has no dropout: in training mode it would compute another function than fused's."""
    model = fused64()
    flat, other = FlatDecoding(model).eval(), FlatDecoding(model).eval()
    src, tgt, src_mask, _ = random_batch(model.config, 2, 5, 3).inputs()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = other.start_static_cache(memory, src_mask, 4)
        assert isinstance(cache, FlatCache)
        with pytest.raises(TypeError, match="FlatCache this FlatDecoding started"):
            flat.static_step(tgt[:, :1], torch.tensor(0), cache)
        with pytest.raises(ValueError, match="max_len must lie in"):
            flat.start_static_cache(memory, src_mask, model.config.max_seq_len + 1)
        flat.train()
        with pytest.raises(RuntimeError, match="no dropout: call it in eval mode"):
            flat.static_step(tgt[:, :1], torch.tensor(0), flat.start_static_cache(memory, src_mask, 4))


@pytest.mark.parametrize("flat", [False, True], ids=["static", "flat"])
def test_an_eager_decoders_results_are_ordinary_tensors_and_its_cache_follows_the_grad_mode(copy_model, flat):
    """An eager call decodes in inference mode (less per op). What it hands back must still be
    an ordinary tensor: ids a training step may embed (autograd saves them), scores it may use.
    And its next-token step, called directly afterwards outside inference mode, starts a cache of
    its own rather than refilling the inference-mode one in place (which torch refuses)."""
    model = copy_model.build("fused", torch.float32)
    src, src_mask = copy_model.src[:4], copy_model.src_mask[:4]
    arguments = dict(max_len=6, bos_id=tasks.BOS_ID, eos_id=tasks.EOS_ID, flat=flat)
    greedy = StaticGreedy(model, **arguments)
    tokens = greedy(src, src_mask)
    best = StaticBeam(model, **arguments)(src, src_mask)
    for tensor in (tokens, best.tokens, best.scores):
        assert not torch.is_inference(tensor)
    embedding = nn.Embedding(copy_model.config.tgt_vocab_size, 3)
    embedding(tokens).sum().backward()  # the ids saved for backward
    assert embedding.weight.grad is not None
    step = greedy.next_token_logp
    with torch.no_grad():
        step.start(src, src_mask)
        assert not torch.is_inference(step(tokens[:, :1]))


def assert_same_products(found: torch.Tensor, expected: torch.Tensor, exact: bool) -> None:
    """int8's products are exact int32 sums scaled alike, so their results agree bit for bit;
    oneDNN may pick another float32 kernel (another order of summing) for a product with a
    post-op, so its results agree to float32 rounding."""
    if exact:
        assert torch.equal(found, expected)
    else:
        torch.testing.assert_close(found, expected)


# each copy whose linears offer ``relu``, and whether its products with and without it are bit-equal
RELU_COPIES = [pytest.param(Int8Linear, with_int8_linears, True, id="int8",
                            marks=pytest.mark.skipif(not int8_available(), reason="needs fbgemm (x86)")),
               pytest.param(OneDnnLinear, with_onednn_linears, False, id="onednn",
                            marks=pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                                     reason="needs oneDNN (mkldnn)"))]


@pytest.mark.parametrize(("packed", "copy_of", "exact"), RELU_COPIES)
def test_a_products_relu_is_relu_of_the_product(packed, copy_of, exact):
    """fbgemm's fused ReLU and oneDNN's post-op clamp the product's float32 results, negatives
    among them."""
    linear = packed(nn.Linear(48, 80))
    x = torch.randn(3, 5, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        product = linear(x)
        assert (product < 0).any() and (product > 0).any()
        assert_same_products(linear.relu(x), torch.relu(product), exact)


def test_a_plain_model_or_another_activation_applies_the_relu_apart():
    config = small_config(dropout=0.0)
    assert not FlatDecoding(build("fused", config, seed=0).eval()).relu_in_product
    gelu = build("fused", small_config(dropout=0.0, activation="gelu"), seed=0).eval()
    assert not FlatDecoding(with_onednn_linears(gelu)).relu_in_product


@pytest.mark.parametrize(("packed", "copy_of", "exact"), RELU_COPIES)
def test_the_relu_runs_inside_the_first_linears_product_where_the_linears_offer_it(packed, copy_of, exact):
    """On the int8 and oneDNN copies of a ReLU model the feed-forward's ReLU is the first linear's
    own (``relu``), and the encoder and step compute what they compute with it applied apart."""
    config = small_config(dropout=0.0)
    copy = copy_of(build("fused", config, seed=0).eval())
    src, tgt, src_mask, _ = random_batch(config, 3, 6, 5).inputs()
    fused_relu, apart = FlatDecoding(copy), FlatDecoding(copy)
    apart.relu_in_product = False
    assert fused_relu.relu_in_product
    assert isinstance(copy.decoder.layers[0].feed_forward.linear1, packed)
    with torch.inference_mode():
        memories = [flat.encode(src, src_mask) for flat in (fused_relu, apart)]
        assert_same_products(*memories, exact)
        caches = [flat.start_static_cache(memories[0], src_mask, 5) for flat in (fused_relu, apart)]
        for t in range(tgt.shape[1]):
            steps = [flat.static_step(tgt[:, t : t + 1], torch.tensor(t), cache)
                     for flat, cache in zip((fused_relu, apart), caches, strict=True)]
            assert_same_products(*steps, exact)
