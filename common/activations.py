"""The feed-forward's nonlinearity, chosen by ``TransformerConfig.activation``: the paper's ReLU,
or what a checkpoint trained elsewhere used. The names are torch.nn.functional's.

    relu  max(0, z)                     the paper (section 3.3)
    gelu  z Φ(z), Φ the normal CDF      the exact erf form, not the tanh approximation
    silu  z σ(z)                        "swish": Marian's opus-mt base models
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from common.config import TransformerConfig

# each name as a function and as a module (for a row that holds its nonlinearity as a submodule)
FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu}
MODULES: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


def activation(config: TransformerConfig) -> Callable[[Tensor], Tensor]:
    """The nonlinearity ``config.activation`` names, as a function (the config checked the name)."""
    return FUNCTIONS[config.activation]


def activation_module(config: TransformerConfig) -> nn.Module:
    """The same nonlinearity as a fresh module, e.g. ``nn.ReLU()``."""
    return MODULES[config.activation]()
