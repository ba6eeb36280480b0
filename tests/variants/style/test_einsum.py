"""What is particular to the einsum variant: one TransformerBlock class in two roles, called as
source 2 calls it, ``block(value, key, query, mask)``."""

from __future__ import annotations

import pytest
import torch

from common.random_batch import random_batch
from tests.helpers import small_config
from tests.variants.style.calls import recording
from variants import build
from variants.einsum.self_attention import SelfAttention
from variants.einsum.transformer_block import TransformerBlock

NORM_MODES = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])


@NORM_MODES
def test_decoder_cross_attention_is_computed_by_a_transformer_block(norm_first):
    config = small_config(norm_first=norm_first, n_layers=2)
    model = build("einsum", config, seed=0).eval().double()
    src, tgt, src_mask, tgt_mask = random_batch(config, seed=0).inputs()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
    for layer in model.decoder.layers:
        block = layer.transformer_block
        assert type(block) is TransformerBlock and type(block.attention) is SelfAttention
        with recording(block, block.attention, layer) as (block_calls, attention_calls, layer_calls), \
                torch.no_grad():
            model.decode(tgt, memory, src_mask, tgt_mask)
        assert len(block_calls) == len(attention_calls) == len(layer_calls) == 1
        # the decoder layer hands the block the encoder output as value and key, its query apart
        (value, key, query, mask), _, block_out = block_calls[0]
        assert value is memory and key is memory and mask is src_mask
        assert query is not memory and query.shape == (tgt.shape[0], tgt.shape[1], config.d_model)
        # the block's attention: values and keys are the encoder output itself, un-normalised in
        # both modes; the query is the decoder's, normalised by the block in pre-norm only
        (values, keys, attn_query, attn_mask), _, _ = attention_calls[0]
        assert values is memory and keys is memory and attn_mask is src_mask
        if norm_first:
            assert torch.equal(attn_query, block.norm1(query))
        else:
            assert attn_query is query
        assert attn_query.shape == (tgt.shape[0], tgt.shape[1], config.d_model)
        assert layer_calls[0].output is block_out  # the block's output is the decoder layer's output


@NORM_MODES
def test_encoder_layers_are_transformer_blocks_attending_over_themselves(norm_first):
    config = small_config(norm_first=norm_first, n_layers=2)
    model = build("einsum", config, seed=0).eval().double()
    src, _, src_mask, _ = random_batch(config, seed=0).inputs()
    assert len(model.encoder.layers) == config.n_layers
    for layer in model.encoder.layers:
        assert type(layer) is TransformerBlock
        with recording(layer, layer.attention) as (block_calls, attention_calls), torch.no_grad():
            model.encode(src, src_mask)
        assert len(block_calls) == len(attention_calls) == 1
        # the encoder calls layer(out, out, out, mask): one tensor is value, key and query
        (value, key, x, mask), _, _ = block_calls[0]
        assert value is key is x and mask is src_mask
        # self-attention: one tensor is query, key and value; in pre-norm, the normalised input
        (values, keys, query, _mask), _, _ = attention_calls[0]
        assert values is keys is query
        if norm_first:
            assert torch.equal(query, layer.norm1(x))
        else:
            assert query is x


@NORM_MODES
def test_block_normalises_key_and_value_only_when_they_are_the_query(norm_first):
    """The rule itself, on one block: the identity ``key is query`` decides, not equal values. A
    copy of the query is a different tensor, so it is attended over as given, like the encoder
    output in cross-attention."""
    config = small_config(norm_first=norm_first, dropout=0.0)
    block = TransformerBlock(config, config.d_ff).double().eval()
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 5, config.d_model, dtype=torch.float64, generator=generator)
    other = torch.randn(2, 7, config.d_model, dtype=torch.float64, generator=generator)
    copy = query.clone()
    for value, key in [(query, query), (other, other), (copy, copy)]:
        with recording(block.attention) as (attention_calls,), torch.no_grad():
            out = block(value, key, query, None)
        (values, keys, attn_query, _), _, _ = attention_calls[0]
        assert out.shape == query.shape
        if norm_first:
            assert torch.equal(attn_query, block.norm1(query))
            assert values is (attn_query if value is query else value)
            assert keys is (attn_query if key is query else key)
        else:
            assert attn_query is query and values is value and keys is key


def test_make_masks_use_the_configured_pad_id():
    model = build("einsum", small_config(pad_id=2))
    src = torch.tensor([[5, 2, 7, 2]])
    trg = torch.tensor([[4, 5, 2]])
    assert model.make_src_mask(src).tolist() == [[[[True, False, True, False]]]]
    assert model.make_trg_mask(trg).tolist() == [[[[True, False, False],
                                                   [True, True, False],
                                                   [True, True, False]]]]


def test_a_checkpoints_fields_are_chosen_when_built():
    """The block's feed-forward takes the width it is given (the encoder's d_ff, the decoder's
    decoder_ff_dim) and config.activation as a module; no final norm is nn.Identity."""
    config = small_config(final_norm=False, activation="gelu", decoder_d_ff=24)
    model = build("einsum", config)
    assert type(model.encoder.norm) is torch.nn.Identity and type(model.decoder.norm) is torch.nn.Identity
    encoder_ff = model.encoder.layers[0].feed_forward
    decoder_ff = model.decoder.layers[0].transformer_block.feed_forward
    assert encoder_ff.linear1.out_features == config.d_ff and decoder_ff.linear1.out_features == 24
    assert type(encoder_ff.activation) is torch.nn.GELU and type(decoder_ff.activation) is torch.nn.GELU
