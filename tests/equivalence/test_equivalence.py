"""Every variant computes the reference's function after a weight transfer."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from common.config import TransformerConfig
from common.random_batch import random_batch
from common.weights import export_gradients
from tests.equivalence.test_dropout import DROPOUT_CONFIGS
from tests.equivalence.test_real_checkpoint_fields import FIELD_CONFIGS
from tests.helpers import FLOAT64_TOL, reference_and, small_config
from variants import FROM_SCRATCH, REFERENCE, VARIANTS, build

# The config fields the defaults leave alone: a LayerNorm eps far from 1e-6 (a variant that
# hard-codes 1e-6 moves log-probs by about eps / 2 relative) and a padding id other than 0;
# and shared embeddings, over small_config's target vocabulary for both.
OTHER_FIELDS = dict(norm_eps=0.05, pad_id=3)
TIED = dict(share_embeddings=True, src_vocab_size=19)
LAYOUTS = [
    pytest.param(dict(norm_first=False, n_layers=1), id="post-norm-1-layer"),
    pytest.param(dict(norm_first=False, n_layers=3), id="post-norm-3-layers"),
    pytest.param(dict(norm_first=True, n_layers=1), id="pre-norm-1-layer"),
    pytest.param(dict(norm_first=True, n_layers=3), id="pre-norm-3-layers"),
    pytest.param(dict(norm_first=False, n_layers=2, **OTHER_FIELDS), id="post-norm-eps-pad"),
    pytest.param(dict(norm_first=True, n_layers=2, **OTHER_FIELDS), id="pre-norm-eps-pad"),
    pytest.param(dict(norm_first=False, n_layers=2, **TIED), id="post-norm-tied"),
    pytest.param(dict(norm_first=True, n_layers=2, **TIED), id="pre-norm-tied"),
]
SHAPES = [pytest.param((3, 7, 5), id="S>T"), pytest.param((2, 4, 9), id="S<T")]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_log_probs_match_reference(subject_variant, layout, shape):
    config = small_config(**layout)
    reference, model = reference_and(subject_variant, config)
    src, tgt, src_mask, tgt_mask = random_batch(config, *shape).inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt, src_mask, tgt_mask),
                                   reference(src, tgt, src_mask, tgt_mask))
        reference.double(), model.double()
        torch.testing.assert_close(model(src, tgt, src_mask, tgt_mask),
                                   reference(src, tgt, src_mask, tgt_mask), **FLOAT64_TOL)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encode_decode_project_match_reference(subject_variant, norm_first):
    """The three stages agree one by one, not only composed."""
    config = small_config(norm_first=norm_first)
    reference, model = reference_and(subject_variant, config)
    reference.double(), model.double()
    src, tgt, src_mask, tgt_mask = random_batch(config).inputs()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        torch.testing.assert_close(memory, reference.encode(src, src_mask), **FLOAT64_TOL)
        hidden = model.decode(tgt, memory, src_mask, tgt_mask)
        torch.testing.assert_close(
            hidden, reference.decode(tgt, memory, src_mask, tgt_mask), **FLOAT64_TOL)
        torch.testing.assert_close(model.project(hidden), reference.project(hidden), **FLOAT64_TOL)


def test_masks_are_optional(subject_variant):
    """``None`` attends everywhere, as in the reference."""
    config = small_config()
    reference, model = reference_and(subject_variant, config)
    reference.double(), model.double()
    src, tgt, _, _ = random_batch(config).inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), reference(src, tgt), **FLOAT64_TOL)


def nll(log_probs: torch.Tensor, tgt: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Next-token NLL over real target positions (the target predicts itself shifted by one)."""
    return F.nll_loss(log_probs[:, :-1].flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=pad_id)


@pytest.mark.parametrize("fields", [{}, OTHER_FIELDS, TIED], ids=["default-fields", "eps-pad", "tied"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_gradients_match_reference(subject_variant, norm_first, fields):
    config = small_config(norm_first=norm_first, dropout=0.0, **fields)
    reference, model = reference_and(subject_variant, config)
    src, tgt, src_mask, tgt_mask = random_batch(config).inputs()
    grads = []
    for m in (reference, model):
        m.double().train()
        nll(m(src, tgt, src_mask, tgt_mask), tgt, config.pad_id).backward()
        grads.append(export_gradients(m))
    expected, actual = grads
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], **FLOAT64_TOL, msg=name)
    assert any(g.abs().sum() > 0 for g in actual.values())


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_same_seed_same_function(norm_first):
    """``build(name, config, seed=0)`` gives every variant the same weights."""
    config = small_config(norm_first=norm_first)
    src, tgt, src_mask, tgt_mask = random_batch(config).inputs()
    outputs = {}
    for name in VARIANTS:
        model = build(name, config, seed=0).eval().double()
        with torch.no_grad():
            outputs[name] = model(src, tgt, src_mask, tgt_mask)
    for name in FROM_SCRATCH:
        torch.testing.assert_close(outputs[name], outputs[REFERENCE], **FLOAT64_TOL, msg=name)
    other = build(REFERENCE, config, seed=1).eval().double()
    with torch.no_grad():
        assert not torch.allclose(other(src, tgt, src_mask, tgt_mask), outputs[REFERENCE])


def test_every_config_field_takes_a_non_default_value_in_some_equivalence_test():
    """A variant that ignores a field (hard-codes eps, say) agrees with the reference wherever
    the field keeps its default, so each field must differ from its default in some config
    that the equivalence tests run: these layouts, the dropout test's (dropout is only seen
    in train mode), or those of the fields for checkpoints trained elsewhere
    (test_real_checkpoint_fields.py). A new field of TransformerConfig fails here until a layout
    sets it."""
    configs = [small_config(**layout.values[0]) for layout in LAYOUTS] + [*DROPOUT_CONFIGS, *FIELD_CONFIGS]
    default = TransformerConfig()
    unexercised = [field.name for field in dataclasses.fields(TransformerConfig)
                   if all(getattr(config, field.name) == getattr(default, field.name)
                          for config in configs)]
    assert not unexercised, f"no equivalence test sets these fields off their default: {unexercised}"
