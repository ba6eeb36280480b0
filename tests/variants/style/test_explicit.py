"""What is particular to the explicit variant: each block hands its sublayers to a
``ResidualConnection`` as call-site lambdas (source 1's style), and every submodule is named by
its role."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from common.random_batch import random_batch
from tests.helpers import small_config
from tests.variants.style.calls import recording
from variants import build

NORM_MODES = pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])

# (stack, attention, its residual connection, the mask it reads, what its keys and values are)
ATTENTION_SITES = pytest.mark.parametrize("stack, attention, residual, mask, keys_values", [
    ("encoder", "self_attn", "self_attn_residual", "src_mask", "x"),
    ("decoder", "self_attn", "self_attn_residual", "tgt_mask", "x"),
    ("decoder", "cross_attn", "cross_attn_residual", "src_mask", "memory"),
], ids=["encoder-self", "decoder-self", "decoder-cross"])


@NORM_MODES
@ATTENTION_SITES
def test_each_lambda_gives_its_attention_the_right_query_keys_values_and_mask(
        norm_first, stack, attention, residual, mask, keys_values):
    """The residual hands its lambda x (post-norm) or norm(x) (pre-norm); the lambda uses it as the
    query, and as keys and values in self-attention only: cross-attention reads the encoder
    output exactly as the encoder returned it, never normalised."""
    config = small_config(norm_first=norm_first)
    model = build("explicit", config, seed=0).eval().double()
    src, tgt, src_mask, tgt_mask = random_batch(config, seed=0).inputs()
    masks = {"src_mask": src_mask, "tgt_mask": tgt_mask}
    for layer in getattr(model, stack).layers:
        connection, attend = getattr(layer, residual), getattr(layer, attention)
        with recording(connection, attend) as (connection_calls, attention_calls), torch.no_grad():
            memory = model.encode(src, src_mask)
            model.decode(tgt, memory, src_mask, tgt_mask)
        assert len(connection_calls) == len(attention_calls) == 1
        (x, sublayer), _, connection_out = connection_calls[0]
        assert isinstance(sublayer, types.LambdaType) and sublayer.__name__ == "<lambda>"
        (query, key, value, attention_mask), _, _ = attention_calls[0]
        if norm_first:
            assert torch.equal(query, connection.norm(x))
        else:
            assert query is x
        expected_keys_values = query if keys_values == "x" else memory
        assert key is expected_keys_values and value is expected_keys_values
        assert attention_mask is masks[mask]
        assert connection_out.shape == x.shape


def test_no_module_stores_a_function():
    """Lambdas are built at the call site and passed along, never kept as a module's attribute."""
    model = build("explicit", small_config())
    for name, module in model.named_modules():
        stored = [key for key, value in vars(module).items()
                  if isinstance(value, (types.FunctionType, types.MethodType))]
        assert not stored, f"{name or 'model'} stores {stored}"


def test_only_the_layer_stacks_are_reached_by_index():
    """An index may count layers of one stack, never pick a role (source 1's
    ``ResidualConnectionLayer[0]``): every other submodule is an attribute named for its job."""
    model = build("explicit", small_config())
    lists = [name for name, module in model.named_modules() if isinstance(module, nn.ModuleList)]
    assert lists == ["encoder.layers", "decoder.layers"]
    for layer in (*model.encoder.layers, *model.decoder.layers):
        assert all(not child.isdigit() for child, _ in layer.named_children())


def test_a_checkpoints_fields_are_chosen_when_built():
    """No final norm is nn.Identity (no LayerNorm with gain 1, which would still re-normalise);
    the feed-forward holds config.activation and each stack's width."""
    config = small_config(final_norm=False, activation="silu", decoder_d_ff=24)
    model = build("explicit", config)
    assert type(model.encoder.norm) is nn.Identity and type(model.decoder.norm) is nn.Identity
    for stack, width in ((model.encoder, config.d_ff), (model.decoder, 24)):
        ff = stack.layers[0].feed_forward
        assert type(ff.activation) is nn.SiLU and ff.linear1.out_features == width
    x = torch.randn(5, config.d_model, dtype=torch.float64)
    assert torch.equal(model.encoder.norm(x), x)
