"""Outside implementations: built by ``package.module:ClassName`` or an entry point, put behind the
shared interface, their weight maps checked; anything that cannot be built is one clear line."""

from __future__ import annotations

import argparse
import sys
from typing import ClassVar

import pytest
import torch

from common.interface import EncoderDecoder
from common.random_batch import random_batch
from common.weights import check_weight_map, export_weights, import_weights, init_canonical, transfer
from tests.fixtures.outside import bugs, tutorial
from tests.helpers import FLOAT64_TOL, small_config
from variants import ENTRY_POINT_GROUP, REFERENCE, SpecError, build, ordered, variant_argument

OUTSIDE = "tests.fixtures.outside"
TUTORIAL = f"{OUTSIDE}.tutorial:Transformer"
FORWARD_ONLY = f"{OUTSIDE}.tutorial:ForwardOnly"


@pytest.mark.parametrize("spec", [TUTORIAL, FORWARD_ONLY, "variants.explicit.model:Transformer"],
                         ids=["stages", "forward-only", "encoder-decoder"])
def test_a_spec_builds_the_reference_function_behind_the_shared_interface(spec):
    config = small_config(norm_first=True)
    model = build(spec, config, seed=0).double().eval()
    reference = build(REFERENCE, config, seed=0).double().eval()
    assert isinstance(model, EncoderDecoder) and model.config is config
    inputs = random_batch(config).inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), reference(*inputs), **FLOAT64_TOL)
    with pytest.raises(ValueError, match="tgt ids must lie in"):  # the interface's checks, too
        model(inputs[0], inputs[1] + config.tgt_vocab_size)


def test_the_stages_protocol_keeps_the_class_its_names_and_its_stages():
    config = small_config()
    model = build(TUTORIAL, config, seed=0).eval()
    assert isinstance(model, tutorial.Transformer) and type(model).__name__ == "Transformer"
    assert type(model).__module__ == tutorial.__name__
    assert {name for name, _ in model.named_parameters()} == set(tutorial.Transformer(config).state_dict())
    src, tgt, src_mask, tgt_mask = random_batch(config).inputs()
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        torch.testing.assert_close(model.project(model.decode(tgt, memory, src_mask, tgt_mask)),
                                   model(src, tgt, src_mask, tgt_mask))
    with pytest.raises(ValueError, match="memory must have shape"):
        model.decode(tgt, memory[:, :, :-1], src_mask, tgt_mask)
    assert build(TUTORIAL, config).__class__ is type(model)  # one adapted class per outside class


def test_a_forward_only_model_says_it_has_no_stages():
    model = build(FORWARD_ONLY, small_config())
    src = random_batch(small_config()).src
    with pytest.raises(NotImplementedError, match="ForwardOnly implements forward only"):
        model.encode(src)
    assert not model.has_cache


def test_weights_move_between_outside_and_builtin_models():
    config = small_config()
    outside, explicit = build(TUTORIAL, config, seed=3), build("explicit", config)
    transfer(outside, explicit)
    assert all(torch.equal(a, b) for a, b in zip(export_weights(explicit).values(),
                                                  init_canonical(config, 3).values(), strict=True))


def test_extra_parameters_are_left_alone_by_transfers():
    config = small_config()
    model = build(f"{OUTSIDE}.bugs:LearnedPositions", config)
    table = model.src_pos.table.weight.detach().clone()
    import_weights(model, init_canonical(config, 1))
    assert torch.equal(model.src_pos.table.weight, table)
    assert "src_pos.table.weight" not in str(export_weights(model).keys())


@pytest.fixture
def registered_package(tmp_path, monkeypatch):
    """A distribution on sys.path that registers the tutorial model as an entry point."""
    info = tmp_path / "outside_models-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: outside-models\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\ntutorial = {TUTORIAL}\n"
                                           f"broken = {OUTSIDE}.nosuch:Model\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "tutorial"


def test_an_entry_point_builds_like_a_registered_variant(registered_package):
    config = small_config()
    model = build(registered_package, config, seed=0)
    assert isinstance(model, tutorial.Transformer)
    with pytest.raises(SpecError, match=r"unknown variant 'nope'; .*registered under "
                                        r"transformer_variants\.variants: tutorial, broken"):
        build("nope", config)
    with pytest.raises(SpecError, match=r"nosuch:Model: cannot import tests\.fixtures\.outside\.nosuch"):
        build("broken", config)


BAD_SPECS = {
    "nosuch": "unknown variant 'nosuch'; known variants: explicit, einsum, mathfirst, fused, torch; "
              "or name a class as package.module:ClassName",
    "nosuch.module:Model": "nosuch.module:Model: cannot import nosuch.module (ModuleNotFoundError: "
                           "No module named 'nosuch')",
    f"{OUTSIDE}.tutorial:Nope": f"{OUTSIDE}.tutorial:Nope: module {OUTSIDE}.tutorial has no attribute Nope",
    f"{OUTSIDE}.tutorial:": f"'{OUTSIDE}.tutorial:' is not package.module:ClassName",
    f"{OUTSIDE}.broken:make_model": f"{OUTSIDE}.broken:make_model is a function, not a class",
    f"{OUTSIDE}.broken:NotAModule": f"{OUTSIDE}.broken:NotAModule is not a torch.nn.Module subclass",
    f"{OUTSIDE}.broken:NoWeightMap": f"{OUTSIDE}.broken:NoWeightMap declares no weight_map",
    f"{OUTSIDE}.broken:NoProtocol": "defines neither forward(src, tgt, src_mask, tgt_mask) nor "
                                    "encode/decode/project",
    f"{OUTSIDE}.broken:TakesNumbers": "the checker builds TakesNumbers(config) from one TransformerConfig, "
                                      "but TakesNumbers.__init__ takes (d_model, heads): subclass it with "
                                      "__init__(self, config)",
    f"{OUTSIDE}.broken:IncompleteMap": "IncompleteMap.weight_map does not cover 2 canonical names: "
                                       "decoder.norm.weight, decoder.norm.bias",
    f"{OUTSIDE}.broken:MisspeltProbe": "MisspeltProbe.probe_map sends encoder.layers.0.ff to "
                                       "'encoder.layers.0.feedforward', which the model lacks (and 3 more "
                                       "like it)",
}


@pytest.mark.parametrize("spec", BAD_SPECS)
def test_what_cannot_be_built_is_one_clear_line(spec):
    with pytest.raises(SpecError) as error:
        build(spec, small_config())
    assert BAD_SPECS[spec] in str(error.value) and "\n" not in str(error.value)


def test_a_module_that_fails_to_import_is_named_with_its_error(tmp_path, monkeypatch):
    (tmp_path / "half_written.py").write_text("import torch\nclass Model(torch.nn.Module:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError, match=r"half_written:Model: cannot import half_written \(SyntaxError: "):
        build("half_written:Model", small_config())


def test_a_spec_is_found_in_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "my_transformer.py").write_text(f"from {OUTSIDE}.tutorial import Transformer\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    assert isinstance(build("my_transformer:Transformer", small_config()), tutorial.Transformer)


class Shared(tutorial.Transformer):
    """Source 2's true layout: one (d_k, d_k) query projection, which canonical weights do not fit."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for layer in self.encoder.layers:
            layer.self_attn.linears[0] = torch.nn.Linear(config.head_dim, config.head_dim)


class Misspelt(tutorial.Transformer):
    """``w1`` for the model's ``w_1``."""

    weight_map: ClassVar[dict] = {**tutorial.Transformer.weight_map,
                                  "{stack}.layers.{i}.ff.w1.{kind}":
                                      "{stack}.layers.{i}.feed_forward.w1.{kind}"}


def test_check_weight_map_names_shapes_and_misspellings_once_per_entry():
    with pytest.raises(LookupError, match=r"sends encoder\.layers\.0\.self_attn\.wq\.weight \(32, 32\) to "
                                          r"encoder\.layers\.0\.self_attn\.linears\.0\.weight, which holds "
                                          r"\(8, 8\) \(and 3 more like it\)"):
        check_weight_map(Shared(small_config()))
    with pytest.raises(LookupError) as error:
        check_weight_map(Misspelt(small_config()))
    assert str(error.value) == ("Misspelt.weight_map sends encoder.layers.0.ff.w1.weight to "
                                "encoder.layers.0.feed_forward.w1.weight, which the model lacks "
                                "(and 7 more like it)")


def test_variant_argument_and_order_for_command_lines():
    assert variant_argument(TUTORIAL) == TUTORIAL
    with pytest.raises(argparse.ArgumentTypeError, match="unknown variant 'nosuch'"):
        variant_argument("nosuch")
    assert ordered(["torch", TUTORIAL, "explicit", "torch"]) == ("explicit", "torch", TUTORIAL)


def test_the_first_divergence_of_every_fixture_is_declared():
    """bugs.FIRST_DIVERGENCE covers every fixture class there (test_checker.py asserts them)."""
    classes = {cls for cls in vars(bugs).values() if isinstance(cls, type)
               and issubclass(cls, tutorial.Transformer) and cls is not tutorial.Transformer}
    assert classes == set(bugs.FIRST_DIVERGENCE)
