"""A config number that must be positive must also be finite."""

from __future__ import annotations

import math

import pytest

from common.config import TransformerConfig


@pytest.mark.parametrize("norm_eps", [math.inf, math.nan, 0.0, -1e-6])
def test_norm_eps_must_be_positive_and_finite(norm_eps):
    """inf would divide every normalised vector to zero: the model's output would not depend on
    its input."""
    with pytest.raises(ValueError, match=r"TransformerConfig\.norm_eps must be positive and finite"):
        TransformerConfig(norm_eps=norm_eps)
