"""The scripts' own machinery: the deviations table's fill-value swap measures what it says."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scripts import deviations


class UnmaskedModel(nn.Module):
    """Uniform log-probs of the right shape, and no masked fill anywhere."""

    config = deviations.CONFIG

    def forward(self, src, tgt, src_mask, tgt_mask):
        return torch.zeros(*tgt.shape, self.config.tgt_vocab_size).log_softmax(-1)


def test_a_source_fill_value_reaches_the_models_masked_scores():
    model = deviations.baseline()
    reference = deviations.log_probs(model)
    with deviations.FillMaskedScoresWith(float("-inf")) as fill:
        every_row_has_a_key = deviations.log_probs(model)
    assert fill.filled > 0
    torch.testing.assert_close(every_row_has_a_key, reference, atol=0.0, rtol=0.0)

    empty = deviations.filled_with(float("-inf"), model)  # an all-padding source: softmax of -infs
    not_finite = ~torch.isfinite(empty).all(dim=-1)  # (B, T)
    assert not_finite[deviations.EMPTY_SOURCE_ROW].all()
    not_finite[deviations.EMPTY_SOURCE_ROW] = False
    assert not not_finite.any()


def test_a_model_that_fills_no_scores_is_refused():
    with pytest.raises(RuntimeError, match="filled no masked scores"):
        deviations.filled_with(float("-inf"), UnmaskedModel())
