"""TransformerConfig validates every field on construction and names the one at fault."""

from __future__ import annotations

import dataclasses

import pytest

from common.config import TransformerConfig


def test_defaults_are_the_papers_base_model():
    config = TransformerConfig()
    assert (config.d_model, config.n_heads, config.n_layers, config.d_ff) == (512, 8, 6, 2048)
    assert (config.dropout, config.norm_eps, config.norm_first) == (0.1, 1e-6, False)
    assert config.head_dim == 64


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TransformerConfig().d_model = 64


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(d_model=100, n_heads=8), "d_model"),
        (dict(d_model=0), "d_model"),
        (dict(n_heads=0), "n_heads"),
        (dict(n_heads=-2), "n_heads"),
        (dict(n_layers=0), "n_layers"),
        (dict(d_ff=0), "d_ff"),
        (dict(src_vocab_size=0), "src_vocab_size"),
        (dict(tgt_vocab_size=-1), "tgt_vocab_size"),
        (dict(max_seq_len=0), "max_seq_len"),
        (dict(dropout=-0.1), "dropout"),
        (dict(dropout=1.0), "dropout"),
        (dict(norm_eps=0.0), "norm_eps"),
        (dict(pad_id=-1), "pad_id"),
        (dict(pad_id=37000), "pad_id"),
        (dict(src_vocab_size=100, tgt_vocab_size=10, pad_id=50), "pad_id"),
        (dict(activation="tanh"), "activation"),
        (dict(activation="swish"), "activation"),
        (dict(activation="ReLU"), "activation"),
        (dict(positions="learned"), "positions"),
        (dict(positions="fairseq", d_model=2, n_heads=1), "positions"),
        (dict(decoder_d_ff=0), "decoder_d_ff"),
        (dict(decoder_d_ff=-4), "decoder_d_ff"),
        (dict(decoder_start="sos"), "decoder_start"),
    ],
)
def test_invalid_value_raises_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        TransformerConfig(**changes)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(d_model=64.0), "d_model"),
        (dict(n_layers=True), "n_layers"),
        (dict(dropout="0.1"), "dropout"),
        (dict(norm_first=1), "norm_first"),
        (dict(activation=None), "activation"),
        (dict(final_norm=0), "final_norm"),
        (dict(positions=1), "positions"),
        (dict(decoder_d_ff=24.0), "decoder_d_ff"),
        (dict(decoder_d_ff=True), "decoder_d_ff"),
        (dict(decoder_start=None), "decoder_start"),
    ],
)
def test_wrong_type_raises_naming_the_field(changes, field):
    with pytest.raises(TypeError, match=rf"\b{field}\b"):
        TransformerConfig(**changes)


def test_replace_validates_again():
    with pytest.raises(ValueError, match="n_heads"):
        TransformerConfig().replace(n_heads=7)
    assert TransformerConfig().replace(n_layers=2).n_layers == 2


def test_the_fields_for_checkpoints_trained_elsewhere_default_to_the_papers_model():
    config = TransformerConfig()
    assert (config.activation, config.final_norm, config.positions, config.decoder_d_ff,
            config.decoder_start) == ("relu", True, "paper", None, "bos")
    assert config.decoder_ff_dim == config.d_ff == 2048
    assert TransformerConfig(decoder_d_ff=4096, d_ff=8192).decoder_ff_dim == 4096


def test_swish_is_refused_with_its_name_here():
    with pytest.raises(ValueError, match=r"swish is SiLU: write 'silu'"):
        TransformerConfig(activation="swish")
