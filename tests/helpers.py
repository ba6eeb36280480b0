"""Shared test helpers: a small config, random canonical weights, model pairs.

Batches come from ``common.random_batch.random_batch``, which tests, scripts and benchmarks share
(it keeps padding where its layout puts it for any ``pad_id``).
"""

from __future__ import annotations

import torch

from common.config import TransformerConfig
from common.weights import canonical_shapes, import_weights, transfer
from variants import REFERENCE, build
from variants.check.tolerances import FLOAT64, LOSSES

# the checker's tolerances (variants/check/tolerances.py), as assert_close's keywords
FLOAT64_TOL = dict(atol=FLOAT64.atol, rtol=FLOAT64.rtol)  # log-probs and gradients in float64
LOSSES_TOL = dict(atol=LOSSES.atol, rtol=LOSSES.rtol)  # losses and weights after optimiser steps, float64


def small_config(**changes) -> TransformerConfig:
    """Small enough for a fast suite; vocabularies differ so a swapped table cannot fit."""
    base = dict(d_model=32, n_heads=4, n_layers=2, d_ff=48, dropout=0.1, src_vocab_size=23,
                tgt_vocab_size=19, max_seq_len=40)
    return TransformerConfig(**{**base, **changes})


def random_canonical(config: TransformerConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every canonical tensor random and distinct (norms and biases too), so a map that
    swaps, transposes or drops any weight changes the output; with ``share_embeddings`` the
    three tied names hold the source embedding's one tensor."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in canonical_shapes(config).items():
        tensor = torch.randn(shape, generator=generator)
        if ".norm" in name and name.endswith(".weight"):
            tensor = 1.0 + 0.3 * tensor
        elif len(shape) == 2 and "embed" not in name:
            tensor = tensor / shape[1] ** 0.5
        else:
            tensor = 0.3 * tensor
        state[name] = tensor
    if config.share_embeddings:
        state["tgt_embed.weight"] = state["generator.weight"] = state["src_embed.weight"]
    return state


def seeded(name: str, config: TransformerConfig) -> torch.nn.Module:
    """Variant ``name`` holding random canonical weights (norms and biases too), float64, eval."""
    model = build(name, config)
    import_weights(model, random_canonical(config))
    return model.double().eval()


def reference_and(name: str, config: TransformerConfig, seed: int = 0):
    """The reference model (``variants.REFERENCE``) with random weights, and variant ``name``
    holding the same."""
    reference = build(REFERENCE, config)
    import_weights(reference, random_canonical(config, seed))
    model = build(name, config)
    transfer(reference, model)
    return reference.eval(), model.eval()
