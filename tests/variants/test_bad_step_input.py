"""Bad input to incremental decoding, and activations of another dtype: a clear TypeError or
ValueError from ``common.checks``, before the model touches a weight."""

from __future__ import annotations

import pytest
import torch

from common.random_batch import random_batch
from tests.helpers import small_config
from tests.variants.test_bad_input import ParameterReads
from variants import FROM_SCRATCH, VARIANTS, build

CONFIG = small_config()  # tgt_vocab 19, max_seq_len 40, d_model 32, 4 heads


def started(name: str, config=CONFIG, batch: int = 3):
    """A model of variant ``name``, the batch, and a cache it started for the batch."""
    model = build(name, config, seed=0).eval()
    src, tgt, src_mask, _ = random_batch(config, batch, min(7, config.max_seq_len), 5).inputs()
    with torch.no_grad():
        cache = model.start_cache(model.encode(src, src_mask), src_mask)
    return model, tgt, cache


@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_a_cache_from_another_model_is_refused(name):
    model, tgt, _ = started(name)
    _, _, other_cache = started(name)  # the same variant, config and weights: still another model
    with pytest.raises(ValueError, match="cache was started by another model"):
        model.decode_step(tgt[:, :1], other_cache)
    with pytest.raises(TypeError, match=r"cache must be a DecoderCache from model\.start_cache, got list"):
        model.decode_step(tgt[:, :1], other_cache.layers)


@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_ids_for_another_batch_size_or_more_than_one_position_are_refused(name):
    model, tgt, cache = started(name)
    with pytest.raises(ValueError, match=r"shape \(B=3, 1\), got \(2, 1\)"):
        model.decode_step(tgt[:2, :1], cache)
    with pytest.raises(ValueError, match=r"shape \(B=3, 1\), got \(3, 2\)"):
        model.decode_step(tgt[:, :2], cache)
    cache.reorder(torch.tensor([0, 0, 1, 1, 2, 2]))  # now 6 rows: the 3 ids no longer fit
    with pytest.raises(ValueError, match=r"shape \(B=6, 1\), got \(3, 1\)"):
        model.decode_step(tgt[:, :1], cache)


@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_a_step_past_max_seq_len_is_refused(name):
    model, tgt, cache = started(name, CONFIG.replace(max_seq_len=4))
    with torch.no_grad():
        for t in range(4):  # positions 0..3
            model.decode_step(tgt[:, t : t + 1], cache)
    with pytest.raises(ValueError, match="decode_step at position 4 is past max_seq_len 4"):
        model.decode_step(tgt[:, 4:5], cache)


@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_a_cache_of_another_dtype_or_device_is_refused(name):
    model, tgt, cache = started(name)
    model.double()
    with pytest.raises(TypeError, match=r"cache has dtype torch\.float32 but the model's parameters "
                                        r"are torch\.float64"):
        model.decode_step(tgt[:, :1], cache)
    model.to("meta")
    with pytest.raises(ValueError, match="cache is on cpu but the model is on meta"):
        model.decode_step(tgt[:, :1].to("meta"), cache)


@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_start_cache_checks_memory_and_mask(name):
    model = build(name, CONFIG, seed=0).eval()
    memory = torch.randn(3, 7, CONFIG.d_model)
    with pytest.raises(TypeError, match=r"memory has dtype torch\.float64 but the model's parameters"):
        model.start_cache(memory.double())
    with pytest.raises(ValueError, match=r"memory must have shape \(B, S, d_model=32\), got \(3, 7, 16\)"):
        model.start_cache(memory[..., :16])
    with pytest.raises(ValueError, match="memory is on meta but the model is on cpu"):
        model.start_cache(memory.to("meta"))
    with pytest.raises(ValueError, match=r"src_mask of shape \(3, 1, 7, 7\) does not broadcast to "
                                         r"\(B=3, H=4, T_query=1, T_key=7\)"):
        model.start_cache(memory, torch.ones(3, 1, 7, 7, dtype=torch.bool))


def test_cache_reorder_checks_its_row_ids():
    _, _, cache = started("explicit")
    with pytest.raises(TypeError, match=r"origin must be a 1-d torch\.long tensor"):
        cache.reorder([0, 1])
    with pytest.raises(ValueError, match=r"origin must hold row ids in \[0, 3\), got \[0, 3\]"):
        cache.reorder(torch.tensor([0, 3]))


@pytest.mark.parametrize("name", VARIANTS)
def test_memory_or_hidden_of_another_dtype_is_a_type_error_in_every_row(name):
    """Before, a float64 memory in a float32 model failed inside a matrix product (RuntimeError)."""
    model = build(name, CONFIG, seed=0).eval()
    _, tgt, src_mask, tgt_mask = random_batch(CONFIG).inputs()
    memory = torch.randn(3, 7, CONFIG.d_model, dtype=torch.float64)
    message = r"{} has dtype torch\.float64 but the model's parameters are torch\.float32; cast"
    reads = ParameterReads(model)
    with reads, pytest.raises(TypeError, match=message.format("memory")):
        model.decode(tgt, memory, src_mask, tgt_mask)
    with reads, pytest.raises(TypeError, match=message.format("hidden")):
        model.project(torch.randn(3, 5, CONFIG.d_model, dtype=torch.float64))
    assert reads.calls == []


@pytest.mark.parametrize("name", VARIANTS)
def test_autocast_activations_are_accepted(name):
    """Under CPU autocast a float32 model's activations are bfloat16: not a dtype mismatch."""
    model = build(name, CONFIG, seed=0).eval()
    src, tgt, src_mask, tgt_mask = random_batch(CONFIG).inputs()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        memory = model.encode(src, src_mask).bfloat16()
        hidden = model.decode(tgt, memory, src_mask, tgt_mask)
        assert torch.isfinite(model.project(hidden.bfloat16())).all()
        if model.has_cache:
            cache = model.start_cache(memory, src_mask)
            assert torch.isfinite(model.project(model.decode_step(tgt[:, :1], cache))).all()
    with pytest.raises(TypeError, match=r"memory has dtype torch\.bfloat16"):
        model.decode(tgt, memory, src_mask, tgt_mask)  # outside autocast: a mismatch again


@pytest.mark.parametrize("name", FROM_SCRATCH)
def test_bad_step_input_is_caught_before_any_tensor_work(name):
    model, tgt, cache = started(name)
    reads = ParameterReads(model)
    with reads, pytest.raises(ValueError):
        model.decode_step(tgt[:2, :1], cache)
    with reads, pytest.raises(TypeError):
        model.start_cache(torch.randn(3, 7, CONFIG.d_model, dtype=torch.float64))
    assert reads.calls == []
    assert cache.length == 0  # and the cache is unchanged
