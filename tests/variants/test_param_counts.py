"""The paper's Table 3 models, parameter for parameter, in every variant.

The expected counts come from the formula below, written out from the one architecture
(docs/architecture.md), not read from any model. Models are built on the meta device: shapes
without memory or init time.
"""

from __future__ import annotations

import pytest
import torch

from common.config import MODEL_PRESETS, TransformerConfig
from variants import build


def expected_count(config: TransformerConfig) -> int:
    """Embeddings, N encoder and N decoder layers, two final norms, the generator."""
    d, f, n, v = config.d_model, config.d_ff, config.n_layers, config.tgt_vocab_size
    attention = 4 * (d * d + d)  # W_q, W_k, W_v, W_o, each with its bias
    feed_forward = (d * f + f) + (f * d + d)  # W_1, b_1, W_2, b_2
    norm = 2 * d  # gain and bias
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    matrices = 1 if config.share_embeddings else 3  # source, target embedding, generator weight
    return (matrices * v * d + n * (encoder_layer + decoder_layer) + 2 * norm
            + v)  # the generator's bias is its own, tied or not


@pytest.mark.parametrize(("config", "count"), [
    pytest.param(MODEL_PRESETS["paper-base"], 63_121_544, id="paper-base"),
    pytest.param(MODEL_PRESETS["paper-big"], 214_286_472, id="paper-big"),
    pytest.param(MODEL_PRESETS["paper-base"].replace(share_embeddings=False), 101_009_544, id="base-untied"),
    pytest.param(MODEL_PRESETS["paper-big"].replace(share_embeddings=False), 290_062_472, id="big-untied"),
])
def test_table_3_parameter_counts(variant, config, count):
    assert expected_count(config) == count
    with torch.device("meta"):
        model = build(variant, config)
    assert sum(p.numel() for p in model.parameters()) == count  # the shared matrix once

