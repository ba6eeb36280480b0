"""The registry: every implementation of the one architecture, built by name.

    model = build("explicit", TransformerConfig(d_model=64, n_heads=4, n_layers=2), seed=0)

With a seed, every variant imports the same canonical weights (``common.weights``), so two
variants built with one seed compute the same function.
"""

from __future__ import annotations

import importlib

from torch import nn

from common.config import TransformerConfig
from common.weights import import_weights, init_canonical

# name -> module holding that variant's ``Transformer``; the reference row comes last
_MODULES = {
    "explicit": "variants.explicit",
    "einsum": "variants.einsum",
    "mathfirst": "variants.mathfirst",
    "fused": "variants.fused",
    "torch": "variants.reference",
}
VARIANTS: tuple[str, ...] = tuple(_MODULES)


def build(name: str, config: TransformerConfig, seed: int | None = None) -> nn.Module:
    """A fresh model of variant ``name``; with ``seed``, the seeded canonical weights."""
    if name not in _MODULES:
        raise ValueError(f"unknown variant {name!r}; known variants: {', '.join(VARIANTS)}")
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
    model = importlib.import_module(_MODULES[name]).Transformer(config)
    if seed is not None:
        import_weights(model, init_canonical(config, seed))
    return model
