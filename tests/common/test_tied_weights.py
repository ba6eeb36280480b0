"""Shared embeddings (paper section 3.4) in the config and the canonical weights: one matrix
under three names, round trips between any two tied variants, and the refusals."""

from __future__ import annotations

import itertools

import pytest
import torch

from common.config import MODEL_PRESETS
from common.weights import (
    TIED,
    canonical_shapes,
    export_weights,
    import_weights,
    init_canonical,
    transfer,
)
from tests.helpers import random_canonical, small_config
from variants import VARIANTS, build

TIED_CONFIG = small_config(tgt_vocab_size=23, share_embeddings=True)  # src_vocab_size is 23

# Where each variant's forward reads the matrix: source embedding, target embedding, generator.
# Written out here, not derived from the weight maps, so a map and a model cannot agree wrongly.
USES = {
    "explicit": ("src_embed.embedding.weight", "tgt_embed.embedding.weight", "projection.linear.weight"),
    "einsum": ("encoder.word_embedding.weight", "decoder.word_embedding.weight", "decoder.fc_out.weight"),
    "mathfirst": ("src_embedding.E", "tgt_embedding.E", "generator.E"),
    "fused": ("src_embed.weight", "tgt_embed.weight", "generator.weight"),
    "torch": ("src_embed.weight", "tgt_embed.weight", "generator.weight"),
}


def test_every_variant_says_where_it_uses_the_tied_matrix():
    assert tuple(USES) == VARIANTS


def test_a_tied_model_reads_one_parameter_in_all_three_uses(variant):
    model = build(variant, TIED_CONFIG, seed=0)
    first, *others = (model.get_parameter(name) for name in USES[variant])
    assert all(other is first for other in others)
    untied = build(variant, TIED_CONFIG.replace(share_embeddings=False), seed=0)
    assert len({id(untied.get_parameter(name)) for name in USES[variant][:2]}) == 2


# --- config --------------------------------------------------------------------------------


def test_share_embeddings_needs_one_vocabulary_and_names_both_sizes():
    with pytest.raises(ValueError, match=r"share_embeddings.*src_vocab_size \(23\).*tgt_vocab_size \(19\)"):
        small_config(share_embeddings=True)
    assert small_config().share_embeddings is False  # the default: three matrices
    with pytest.raises(TypeError, match="share_embeddings"):
        small_config(tgt_vocab_size=23, share_embeddings=1)


def test_the_papers_table_3_models_are_named_in_the_config_module():
    base, big = MODEL_PRESETS["paper-base"], MODEL_PRESETS["paper-big"]
    assert (base.d_model, base.n_heads, base.n_layers, base.d_ff, base.dropout) == (512, 8, 6, 2048, 0.1)
    assert (big.d_model, big.n_heads, big.n_layers, big.d_ff, big.dropout) == (1024, 16, 6, 4096, 0.3)
    for config in (base, big):
        assert config.share_embeddings
        assert config.src_vocab_size == config.tgt_vocab_size == 37_000


# --- canonical weights ---------------------------------------------------------------------


def test_init_canonical_draws_one_matrix_and_uses_it_three_times():
    state = init_canonical(TIED_CONFIG, seed=0)
    assert {name: tuple(t.shape) for name, t in state.items()} == canonical_shapes(TIED_CONFIG)
    assert state[TIED[1]] is state[TIED[0]] and state[TIED[2]] is state[TIED[0]]
    # drawn as an embedding, N(0, 1/d_model): the untied draw of src_embed.weight, same seed
    untied = init_canonical(TIED_CONFIG.replace(share_embeddings=False), seed=0)
    assert torch.equal(state[TIED[0]], untied[TIED[0]])
    assert not torch.equal(untied[TIED[0]], untied[TIED[1]])


def test_export_of_a_tied_model_has_the_three_names_all_equal(variant):
    model = build(variant, TIED_CONFIG, seed=0)
    state = export_weights(model)
    assert {name: tuple(t.shape) for name, t in state.items()} == canonical_shapes(TIED_CONFIG)
    assert all(torch.equal(state[name], state[TIED[0]]) for name in TIED)
    # the model counts the matrix once: every parameter but one tied matrix, one bias apart
    count = sum(p.numel() for p in model.parameters())
    assert count == sum(t.numel() for t in state.values()) - 2 * state[TIED[0]].numel()


@pytest.mark.parametrize(("source", "target"), list(itertools.product(VARIANTS, VARIANTS)))
def test_tied_round_trip_between_any_two_variants_is_bit_exact(source, target):
    state = random_canonical(TIED_CONFIG, seed=3)
    first, second, back = build(source, TIED_CONFIG), build(target, TIED_CONFIG), build(source, TIED_CONFIG)
    import_weights(first, state)
    transfer(first, second)
    transfer(second, back)
    for model in (first, second, back):
        exported = export_weights(model)
        assert exported.keys() == state.keys()
        assert all(torch.equal(exported[name], state[name]) for name in state)


def test_importing_three_different_matrices_into_a_tied_model_is_refused(variant):
    model = build(variant, TIED_CONFIG, seed=0)
    before = export_weights(model)
    state = random_canonical(TIED_CONFIG, seed=1)
    state["generator.weight"] = state["generator.weight"] + 1e-7  # close, but another matrix
    with pytest.raises(ValueError, match=r"share_embeddings.*generator\.weight differ.*nothing is "
                                         r"averaged or picked") as raised:
        import_weights(model, state)
    assert "tgt_embed.weight" not in str(raised.value).split("but")[1]  # only the one that differs
    after = export_weights(model)
    assert all(torch.equal(after[name], before[name]) for name in before)  # left unchanged
    # an untied state (three independent matrices) names both others
    with pytest.raises(ValueError, match=r"tgt_embed\.weight and generator\.weight differ"):
        import_weights(model, random_canonical(TIED_CONFIG.replace(share_embeddings=False)))


@pytest.mark.parametrize("direction", ["tied->untied", "untied->tied"])
def test_transfer_between_tied_and_untied_is_refused_and_says_why(variant, direction):
    tied = build(variant, TIED_CONFIG, seed=0)
    untied = build(variant, TIED_CONFIG.replace(share_embeddings=False), seed=0)
    source, target = (tied, untied) if direction == "tied->untied" else (untied, tied)
    before = export_weights(target)
    with pytest.raises(ValueError, match=r"share_embeddings.*a tied model holds one matrix.*"
                                         r"untied one three"):
        transfer(source, target)
    after = export_weights(target)
    assert all(torch.equal(after[name], before[name]) for name in before)


# --- a model that ties wrongly is caught by the map machinery ------------------------------


@pytest.mark.parametrize("use", [1, 2], ids=["tgt_embed", "generator"])
def test_a_tied_config_whose_model_ties_only_two_uses_is_refused(variant, use):
    model = build(variant, TIED_CONFIG)
    name = USES[variant][use]
    module, attribute = name.rsplit(".", 1)
    setattr(model.get_submodule(module), attribute,
            torch.nn.Parameter(model.get_parameter(name).detach().clone()))  # a copy, not the one
    with pytest.raises(LookupError, match=r"share_embeddings.*must send .* to one parameter"):
        export_weights(model)


def test_an_untied_config_whose_model_ties_anyway_is_refused(variant):
    model = build(variant, TIED_CONFIG.replace(share_embeddings=False))
    src, tgt = USES[variant][:2]
    module, attribute = tgt.rsplit(".", 1)
    setattr(model.get_submodule(module), attribute, model.get_parameter(src))
    with pytest.raises(LookupError, match="not exactly once"):
        export_weights(model)


def test_a_move_that_makes_new_parameters_is_caught(variant):
    """torch keeps a parameter object through ``.to()`` only where it can set its ``.data``
    (a dtype change, CPU <-> CUDA); a move to "meta" makes a new parameter per module, which
    unties the matrix. Nothing then exports such a model as if it were tied."""
    model = build(variant, TIED_CONFIG, seed=0).to("meta")
    with pytest.raises(LookupError, match="share_embeddings"):
        export_weights(model)
