"""Mask helpers, and what masks promise: padding and the future never leak into real outputs."""

from __future__ import annotations

import torch

from common.masks import causal_mask, decoder_mask, mask_scores, padding_mask, target_padding_mask
from common.random_batch import random_batch
from tests.helpers import reference_and, small_config


def test_padding_mask_marks_real_tokens():
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 0]])
    mask = padding_mask(ids, pad_id=0)
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 1, 4)
    assert mask[:, 0, 0].tolist() == [[True, True, False, False], [True, False, True, False]]


def test_padding_mask_uses_the_given_pad_id():
    ids = torch.tensor([[0, 3, 3]])
    assert padding_mask(ids, pad_id=3)[0, 0, 0].tolist() == [True, False, False]


def test_causal_mask_is_lower_triangular():
    mask = causal_mask(4)
    assert mask.dtype == torch.bool and mask.shape == (1, 1, 4, 4)
    for query in range(4):
        assert mask[0, 0, query].tolist() == [key <= query for key in range(4)]


def test_decoder_mask_is_causal_and_padding():
    tgt = torch.tensor([[4, 5, 0], [4, 5, 6]])
    mask = decoder_mask(tgt, pad_id=0)
    assert mask.shape == (2, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert torch.equal(mask[1, 0], causal_mask(3)[0, 0])


def test_target_padding_mask_keeps_position_0_the_start_token():
    """Position 0 is the decoder's start token, a key whatever its id (Marian starts with the
    padding id); elsewhere it is padding_mask."""
    tgt = torch.tensor([[3, 5, 3], [4, 3, 6]])
    mask = target_padding_mask(tgt, pad_id=3)
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 1, 3)
    assert mask[:, 0, 0].tolist() == [[True, True, False], [True, False, True]]
    assert torch.equal(target_padding_mask(tgt[1:], 3), padding_mask(tgt[1:], 3))
    assert torch.equal(decoder_mask(tgt, 3), mask & causal_mask(3))


def test_mask_scores_fills_with_the_most_negative_finite_value():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        scores = torch.zeros(1, 1, 2, 3, dtype=dtype)
        mask = torch.tensor([[True, False, True], [False, False, False]])
        filled = mask_scores(scores, mask)
        assert filled[0, 0, 0].tolist() == [0.0, torch.finfo(dtype).min, 0.0]
        assert torch.isfinite(filled).all()
        assert torch.isfinite(filled.softmax(-1)).all()  # a fully masked row is uniform
    assert mask_scores(scores, None) is scores


def outputs(model, src, tgt, src_mask, tgt_mask) -> torch.Tensor:
    with torch.no_grad():
        return model(src, tgt, src_mask, tgt_mask)


def test_padding_token_ids_never_reach_real_positions(variant):
    """With the masks fixed, whatever id sits at a padded position changes no real output."""
    config = small_config()
    _, model = reference_and(variant, config)
    model.double()
    src, tgt, src_mask, tgt_mask = random_batch(config).inputs()
    before = outputs(model, src, tgt, src_mask, tgt_mask)
    src2, tgt2 = src.clone(), tgt.clone()
    src2[src == config.pad_id] = 7
    tgt2[tgt == config.pad_id] = 5
    assert not torch.equal(src2, src) and not torch.equal(tgt2, tgt)
    after = outputs(model, src2, tgt2, src_mask, tgt_mask)
    real = tgt != config.pad_id
    torch.testing.assert_close(after[real], before[real], atol=1e-12, rtol=0)
    assert not torch.allclose(after[~real], before[~real])  # the padded rows did see the change


def test_future_target_tokens_never_reach_earlier_positions(variant):
    config = small_config()
    _, model = reference_and(variant, config)
    model.double()
    src, tgt, src_mask, tgt_mask = random_batch(config, batch=2, src_len=6, tgt_len=8).inputs()
    tgt[:] = torch.randint(1, config.tgt_vocab_size, tgt.shape, generator=torch.Generator().manual_seed(1))
    tgt_mask = decoder_mask(tgt, config.pad_id)
    before = outputs(model, src, tgt, src_mask, tgt_mask)
    changed_at = 4
    tgt2 = tgt.clone()
    tgt2[:, changed_at] = tgt[:, changed_at] % (config.tgt_vocab_size - 1) + 1
    after = outputs(model, src, tgt2, src_mask, tgt_mask)
    torch.testing.assert_close(after[:, :changed_at], before[:, :changed_at], atol=1e-12, rtol=0)
    assert not torch.allclose(after[:, changed_at:], before[:, changed_at:])
