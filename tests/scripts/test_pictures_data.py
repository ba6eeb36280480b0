"""What ``python -m scripts.pictures`` draws as the attention picture (the data, not the PNG's
pixels) is the layer's masked attention weights: softmax(Q Kᵀ / √Dh) per head, worked out here
from the layer's canonical weights and its captured input, with the padding keys' columns zero."""

from __future__ import annotations

import math

import torch

from common.config import TransformerConfig
from common.masks import padding_mask
from common.probes import capture
from common.weights import export_weights
from scripts.pictures import attention_picture
from variants import build

TOKENS = [5, 9, 3, 7, 0, 0]  # 0 is padding: the last two keys are masked
HEADS, LAYER = 2, 1
CONFIG = TransformerConfig(d_model=16, n_heads=HEADS, n_layers=2, d_ff=64, src_vocab_size=1000,
                           tgt_vocab_size=1000, max_seq_len=10)


def test_the_attention_picture_is_the_masked_attention_weights():
    picture = attention_picture(CONFIG, seed=0, tokens=TOKENS, layer=LAYER)
    weights = picture.weights  # (H, S, S)
    assert picture.tokens == TOKENS and weights.shape == (HEADS, len(TOKENS), len(TOKENS))

    # the same seeded model, the layer's input captured on a forward pass under the padding mask
    model = build("mathfirst", CONFIG, seed=0).eval()
    src = torch.tensor([TOKENS])  # (1, S)
    mask = padding_mask(src, CONFIG.pad_id)  # (1, 1, 1, S)
    points = capture(model, (src, src[:, :1], mask, None))
    x = points[f"encoder.layers.{LAYER - 1}"][0]  # (S, D): post-norm, the previous layer's output
    state = export_weights(model)
    head_dim = CONFIG.d_model // HEADS
    prefix = f"encoder.layers.{LAYER}.self_attn"
    q, k = ((x @ state[f"{prefix}.{w}.weight"].T + state[f"{prefix}.{w}.bias"]).view(-1, HEADS, head_dim)
            for w in ("wq", "wk"))  # (S, H, Dh) each
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)  # (H, S, S)
    expected = scores.masked_fill(~mask[0], -math.inf).softmax(dim=-1)  # (H, S, S)

    torch.testing.assert_close(weights, expected)
    padding = torch.tensor(TOKENS) == CONFIG.pad_id
    assert (weights[..., padding] == 0).all()  # no query looks at padding, in any head
    assert (weights[..., ~padding] > 0).all()
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(HEADS, len(TOKENS)))
