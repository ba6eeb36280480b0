"""The sinusoid table of section 3.5, shared by every variant that does not derive it itself."""

from __future__ import annotations

import torch
from torch import Tensor


def sinusoid_table(max_len: int, d_model: int) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(...); (max_len, D) float64.

    Kept in float64 and cast where it is added, so float64 runs are exact and lower
    precisions round once. An odd d_model drops the last cosine column.
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = position / 10000.0 ** (two_i / d_model)  # (max_len, ceil(D/2))
    table = torch.empty(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table
