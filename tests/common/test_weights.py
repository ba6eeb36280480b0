"""The canonical weight format: exact round trips, strict all-or-nothing import."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from common.random_batch import random_batch
from common.weights import (
    absent_parts,
    canonical_shapes,
    check_weight_map,
    export_weights,
    import_weights,
    init_canonical,
    transfer,
)
from tests.helpers import random_canonical, small_config
from variants import REFERENCE, build
from variants.explicit.model import Transformer as Explicit


def assert_states_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


def test_export_lists_every_canonical_name_with_its_shape(variant):
    config = small_config(n_layers=3)
    state = export_weights(build(variant, config, seed=0))
    assert {name: tuple(t.shape) for name, t in state.items()} == canonical_shapes(config)


def test_export_then_import_is_bit_exact(variant):
    config = small_config()
    state = random_canonical(config)
    model = build(variant, config)
    import_weights(model, state)
    assert_states_equal(export_weights(model), state)


def test_round_trip_through_the_reference_is_bit_exact(variant):
    config = small_config()
    model = build(variant, config)
    import_weights(model, random_canonical(config, seed=3))
    before = export_weights(model)
    reference, back = build(REFERENCE, config), build(variant, config)
    transfer(model, reference)
    transfer(reference, back)
    assert_states_equal(export_weights(back), before)
    params, back_params = dict(model.named_parameters()), dict(back.named_parameters())
    assert params.keys() == back_params.keys()
    assert all(torch.equal(params[name], back_params[name]) for name in params)


def test_export_is_a_copy(variant):
    model = build(variant, small_config(), seed=0)
    state = export_weights(model)
    state["generator.bias"].add_(1.0)
    assert not torch.equal(export_weights(model)["generator.bias"], state["generator.bias"])


def test_build_with_seed_imports_the_seeded_canonical_weights(variant):
    config = small_config()
    assert_states_equal(export_weights(build(variant, config, seed=7)), init_canonical(config, 7))
    assert not torch.equal(init_canonical(config, 7)["src_embed.weight"],
                           init_canonical(config, 8)["src_embed.weight"])


def bad_state(config, fault: str) -> tuple[dict, list[str]]:
    """A canonical state with one kind of fault, and the names the error must mention."""
    state = random_canonical(config)
    if fault == "missing":
        del state["decoder.layers.1.cross_attn.wk.bias"], state["generator.weight"]
        return state, ["decoder.layers.1.cross_attn.wk.bias", "generator.weight"]
    if fault == "unexpected":
        state["encoder.layers.9.ff.w1.weight"] = torch.zeros(3)
        state["extra"] = torch.zeros(1)
        return state, ["encoder.layers.9.ff.w1.weight", "extra"]
    if fault == "mis-shaped":
        state["encoder.layers.0.ff.w1.weight"] = state["encoder.layers.0.ff.w1.weight"].T
        state["tgt_embed.weight"] = state["tgt_embed.weight"][:-1]
        return state, ["encoder.layers.0.ff.w1.weight", "tgt_embed.weight"]
    if fault == "non-finite":
        state["encoder.norm.bias"][3] = float("nan")
        state["decoder.layers.0.self_attn.wo.weight"][0, 0] = float("inf")
        return state, ["encoder.norm.bias", "decoder.layers.0.self_attn.wo.weight"]
    raise AssertionError(fault)


@pytest.mark.parametrize("fault", ["missing", "unexpected", "mis-shaped", "non-finite"])
def test_bad_state_raises_naming_each_key_and_changes_nothing(variant, fault):
    config = small_config()
    model = build(variant, config, seed=0)
    before = export_weights(model)
    state, offenders = bad_state(config, fault)
    with pytest.raises(ValueError) as error:
        import_weights(model, state)
    for name in offenders:
        assert name in str(error.value)
    assert_states_equal(export_weights(model), before)


def test_weights_of_another_config_raise_naming_each_field(variant):
    """n_heads and norm_first leave every shape alone: only the config can catch them."""
    config = small_config()
    other = config.replace(n_heads=2, norm_first=True)
    source = build(REFERENCE, other, seed=1)
    model = build(variant, config, seed=0)
    before = export_weights(model)
    with pytest.raises(ValueError, match="n_heads") as error:
        transfer(source, model)
    assert "norm_first" in str(error.value)
    assert_states_equal(export_weights(model), before)


def test_weights_of_another_size_raise(variant):
    model = build(variant, small_config(), seed=0)
    with pytest.raises(ValueError, match="d_model"):
        transfer(build(REFERENCE, small_config(d_model=16, n_heads=4), seed=0), model)


def test_import_rejects_a_non_mapping(variant):
    with pytest.raises(TypeError, match="mapping"):
        import_weights(build(variant, small_config()), [("generator.bias", torch.zeros(19))])


def test_saved_state_loads_with_weights_only_and_round_trips(variant, tmp_path):
    config = small_config()
    model = build(variant, config)
    import_weights(model, random_canonical(config, seed=5))
    path = tmp_path / "weights.pt"
    torch.save(export_weights(model), path)
    loaded = torch.load(path, weights_only=True)
    fresh = build(variant, config)
    import_weights(fresh, loaded)
    assert_states_equal(export_weights(fresh), export_weights(model))
    src, tgt, src_mask, tgt_mask = random_batch(config).inputs()
    with torch.no_grad():
        assert torch.equal(fresh.eval()(src, tgt, src_mask, tgt_mask),
                           model.eval()(src, tgt, src_mask, tgt_mask))


def test_import_casts_to_the_model_dtype(variant):
    config = small_config()
    model = build(variant, config).double()
    state = random_canonical(config)
    import_weights(model, state)
    exported = export_weights(model)
    assert all(t.dtype == torch.float64 for t in exported.values())
    assert_states_equal({k: v.float() for k, v in exported.items()}, state)


def test_a_map_entry_for_an_absent_weight_is_passed_over_but_a_misspelt_one_is_not():
    """Without final norms the canonical names have no encoder.norm/decoder.norm; a variant's
    one map keeps its entry for them, passed over there, and a typo is still named."""
    config = small_config(final_norm=False)
    assert absent_parts(config) == ["encoder.norm.weight", "encoder.norm.bias",
                                    "decoder.norm.weight", "decoder.norm.bias"]
    assert absent_parts(small_config()) == []
    check_weight_map(Explicit(config))

    class Typo(Explicit):
        weight_map: ClassVar[dict] = {**Explicit.weight_map, "{stack}.nrom.{kind}": "x"}

    with pytest.raises(LookupError, match=r"entry '\{stack\}.nrom.\{kind\}' matches no canonical name"):
        check_weight_map(Typo(config))
