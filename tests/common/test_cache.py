"""The cache's own checks: ``reorder`` names what it got when it is not a row-id tensor."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from common.cache import DecoderCache, LayerCache


def small_cache(batch: int = 3) -> DecoderCache:
    """A cache of ``batch`` rows: one layer, (B, 2, 4) keys and values, no source mask."""
    layer = LayerCache(*(torch.zeros(batch, 2, 4) for _ in range(4)))
    return DecoderCache(nn.Linear(4, 4), [layer], None, torch.zeros(batch, 2, 4))


@pytest.mark.parametrize("origin, got", [
    (torch.tensor([0, 1], dtype=torch.int32), "got torch.int32 tensor of shape (2,)"),
    (torch.tensor([[0, 1]]), "got torch.int64 tensor of shape (1, 2)"),
    ([0, 1], "got list"),
])
def test_reorder_names_the_dtype_and_shape_or_the_type_it_got(origin, got):
    message = f"origin must be a 1-d torch.long tensor of row ids, {got}"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        small_cache().reorder(origin)
