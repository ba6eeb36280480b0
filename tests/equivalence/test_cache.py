"""Incremental decoding: at every step the cached decode step equals the uncached decode's last
position, in every from-scratch variant, post- and pre-norm, float64 and float32; a reordered
cache steps like the reordered prefixes."""

from __future__ import annotations

import pytest
import torch

from common.masks import decoder_mask
from common.random_batch import random_batch
from tests.helpers import FLOAT64_TOL, reference_and, small_config
from variants import FROM_SCRATCH, REFERENCE, VARIANTS, build

EOS = 2
NORM_MODES = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
PRECISIONS = pytest.mark.parametrize(
    "dtype, tolerance", [(torch.float64, FLOAT64_TOL), (torch.float32, {})], ids=["float64", "float32"])


def sources_and_targets(config, batch: int = 4, src_len: int = 6, tgt_len: int = 9, seed: int = 0):
    """Padded sources (row r ends in r padding ids) and targets as greedy decoding grows them:
    BOS, then ids; row r > 0 ends with EOS at position 2r + 1 and holds padding after it, so
    rows finish at different steps (row 0 never does). S != T."""
    src, tgt, src_mask, _ = random_batch(config, batch, src_len, tgt_len, seed=seed).inputs()
    tgt = tgt.masked_fill(tgt == EOS, 3)  # an EOS only where it is put below
    tgt[:, 0] = 1  # BOS
    positions = torch.arange(tgt_len)
    for row in range(1, batch):
        end = 2 * row + 1
        tgt[row, end] = EOS
        tgt[row] = tgt[row].masked_fill(positions > end, config.pad_id)
    return src, src_mask, tgt


def step_errors(model, src, src_mask, tgt) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """At each step t: (the cached step's log-probs, the uncached decode's at its last position)."""
    pad = model.config.pad_id
    pairs = []
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = model.start_cache(memory, src_mask)
        for t in range(tgt.shape[1]):
            prefix = tgt[:, : t + 1]  # (B, t + 1)
            cached = model.project(model.decode_step(prefix[:, -1:], cache))[:, 0]  # (B, V)
            full = model.decode(prefix, memory, src_mask, decoder_mask(prefix, pad))
            pairs.append((cached, model.project(full)[:, -1]))
        assert cache.length == tgt.shape[1]
    return pairs


def test_every_from_scratch_variant_has_a_cache_and_the_reference_none():
    config = small_config()
    assert {name: build(name, config).has_cache for name in VARIANTS} == {
        name: name != REFERENCE for name in VARIANTS}
    with pytest.raises(NotImplementedError, match=r"no key/value cache.*full recompute"):
        build(REFERENCE, config).start_cache(torch.zeros(1, 2, config.d_model))


@NORM_MODES
@PRECISIONS
@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_each_cached_step_equals_the_last_position_of_the_full_decode(name, norm_first, dtype, tolerance):
    config = small_config(norm_first=norm_first)
    _, model = reference_and(name, config)
    model.to(dtype)
    src, src_mask, tgt = sources_and_targets(config)
    assert (src == config.pad_id).any() and (tgt == config.pad_id).any() and src.shape[1] != tgt.shape[1]
    for t, (cached, full) in enumerate(step_errors(model, src, src_mask, tgt)):
        torch.testing.assert_close(cached, full, **tolerance, msg=lambda m, t=t: f"step {t}: {m}")


@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_one_source_mask_for_every_row_and_none_at_all(name):
    """A mask that broadcasts over the batch, and no mask: the cache holds one row per source."""
    config = small_config()
    _, model = reference_and(name, config)
    model.double()
    src, src_mask, tgt = sources_and_targets(config)
    for mask in (src_mask[:1], None):
        for t, (cached, full) in enumerate(step_errors(model, src, mask, tgt)):
            torch.testing.assert_close(cached, full, **FLOAT64_TOL, msg=lambda m, t=t: f"step {t}: {m}")


@NORM_MODES
@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_reordered_cache_steps_like_the_reordered_prefixes(name, norm_first):
    """Beam search's reorder: after it, row i continues old row origin[i] — its keys and values,
    its ids' padding and its source (mask and cross-attention keys and values)."""
    config = small_config(norm_first=norm_first)
    _, model = reference_and(name, config)
    model.double()
    src, src_mask, tgt = sources_and_targets(config)
    origin = torch.tensor([3, 1, 1, 0, 2, 3])  # rows repeat, and row 1 moves up: 4 -> 6 rows
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = model.start_cache(memory, src_mask)
        for t in range(4):
            model.decode_step(tgt[:, t : t + 1], cache)
        cache.reorder(origin)
        prefix = tgt[origin, :5]  # (6, 5)
        cached = model.project(model.decode_step(prefix[:, -1:], cache))[:, 0]
        full = model.decode(prefix, memory[origin], src_mask[origin], decoder_mask(prefix, config.pad_id))
    torch.testing.assert_close(cached, model.project(full)[:, -1], **FLOAT64_TOL)
    assert cache.batch_size == len(origin) and torch.equal(cache.tokens, prefix)


def test_cache_grows_by_two_d_model_values_per_layer_and_token():
    """The memory a token costs: per decoder layer a key and a value of D numbers each; the
    encoder output's keys and values, 2·S·D per layer, once."""
    config = small_config()
    src, src_mask, tgt = sources_and_targets(config)
    batch, src_len = src.shape
    per_layer_and_row = {"cross": 2 * src_len * config.d_model, "token": 2 * config.d_model}
    for name in FROM_SCRATCH:
        model = build(name, config, seed=0).eval()
        with torch.no_grad():
            cache = model.start_cache(model.encode(src, src_mask), src_mask)
            start = cache.nbytes()
            for t in range(3):
                model.decode_step(tgt[:, t : t + 1], cache)
        elements = config.n_layers * batch
        assert start == elements * per_layer_and_row["cross"] * 4, name  # float32: 4 bytes
        assert cache.nbytes() - start == 3 * elements * per_layer_and_row["token"] * 4, name
