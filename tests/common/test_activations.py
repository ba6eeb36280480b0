"""common.activations: each name as a function and as a module, both the formula it names
(written out here), and one for every value TransformerConfig.activation accepts."""

from __future__ import annotations

import math

import pytest
import torch

from common.activations import FUNCTIONS, MODULES, activation, activation_module
from common.config import ACTIVATIONS
from tests.helpers import small_config

FORMULAS = {
    "relu": lambda z: torch.where(z > 0, z, torch.zeros_like(z)),
    "gelu": lambda z: z * 0.5 * (1 + torch.erf(z / math.sqrt(2))),
    "silu": lambda z: z / (1 + torch.exp(-z)),
}


def test_every_config_value_has_a_function_and_a_module():
    assert set(FUNCTIONS) == set(MODULES) == set(ACTIVATIONS)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_the_function_and_the_module_are_the_formula(name):
    z = torch.linspace(-4, 4, 81, dtype=torch.float64)
    config = small_config(activation=name)
    torch.testing.assert_close(activation(config)(z), FORMULAS[name](z), rtol=0, atol=1e-12)
    torch.testing.assert_close(activation_module(config)(z), FORMULAS[name](z), rtol=0, atol=1e-12)
