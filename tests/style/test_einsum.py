"""What is particular to the einsum variant: one TransformerBlock class in two roles."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import make_batch, small_config
from variants import build
from variants.einsum.self_attention import SelfAttention
from variants.einsum.transformer_block import TransformerBlock

NORM_MODES = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])


def record_calls(module: torch.nn.Module, calls: list) -> torch.utils.hooks.RemovableHandle:
    """Append (args, kwargs, output) to ``calls`` each time ``module`` runs."""
    def hook(_module, args, kwargs, output):
        calls.append((args, kwargs, output))
    return module.register_forward_hook(hook, with_kwargs=True)


@NORM_MODES
def test_decoder_cross_attention_is_computed_by_a_transformer_block(norm_first):
    config = small_config(norm_first=norm_first, n_layers=2)
    model = build("einsum", config, seed=0).eval().double()
    src, tgt, src_mask, tgt_mask = make_batch(config)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
    for layer in model.decoder.layers:
        block = layer.transformer_block
        assert type(block) is TransformerBlock and type(block.attention) is SelfAttention
        block_calls, attention_calls, layer_calls = [], [], []
        handles = [record_calls(block, block_calls), record_calls(block.attention, attention_calls),
                   record_calls(layer, layer_calls)]
        with torch.no_grad():
            model.decode(tgt, memory, src_mask, tgt_mask)
        for handle in handles:
            handle.remove()
        assert len(block_calls) == len(attention_calls) == len(layer_calls) == 1
        (query, mask), block_kwargs, block_out = block_calls[0]
        assert block_kwargs["memory"] is memory and mask is src_mask
        # the block's attention: values and keys are the encoder output itself, un-normalised in
        # both modes; the query is the decoder's, normalised by the block in pre-norm only
        (values, keys, attn_query, attn_mask), _, _ = attention_calls[0]
        assert values is memory and keys is memory and attn_mask is src_mask
        if norm_first:
            assert torch.equal(attn_query, block.norm1(query))
        else:
            assert attn_query is query
        assert attn_query.shape == (tgt.shape[0], tgt.shape[1], config.d_model)
        assert layer_calls[0][2] is block_out  # the block's output is the decoder layer's output


@NORM_MODES
def test_encoder_layers_are_transformer_blocks_attending_over_themselves(norm_first):
    config = small_config(norm_first=norm_first, n_layers=2)
    model = build("einsum", config, seed=0).eval().double()
    src, _, src_mask, _ = make_batch(config)
    assert len(model.encoder.layers) == config.n_layers
    for layer in model.encoder.layers:
        assert type(layer) is TransformerBlock
        block_calls, attention_calls = [], []
        handles = [record_calls(layer, block_calls), record_calls(layer.attention, attention_calls)]
        with torch.no_grad():
            model.encode(src, src_mask)
        for handle in handles:
            handle.remove()
        assert len(block_calls) == len(attention_calls) == 1
        (x, _mask), block_kwargs, _ = block_calls[0]
        assert block_kwargs.get("memory") is None
        # self-attention: one tensor is query, key and value; in pre-norm, the normalised input
        (values, keys, query, _mask), _, _ = attention_calls[0]
        assert values is keys is query
        if norm_first:
            assert torch.equal(query, layer.norm1(x))
        else:
            assert query is x


def test_make_masks_use_the_configured_pad_id():
    model = build("einsum", small_config(pad_id=2))
    src = torch.tensor([[5, 2, 7, 2]])
    trg = torch.tensor([[4, 5, 2]])
    assert model.make_src_mask(src).tolist() == [[[[True, False, True, False]]]]
    assert model.make_trg_mask(trg).tolist() == [[[[True, False, False],
                                                   [True, True, False],
                                                   [True, True, False]]]]
