"""One cache API in every own-code variant: each ``forward`` computes the forward pass and nothing
else (no ``cache`` argument, no encoder-output-is-None mode), and the incremental decoding is
each decoder layer's ``start_cache(memory) -> LayerCache`` and ``step(x, cache, src_mask,
tgt_mask)``, with the same parameters in every variant (each names them in its own style)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from common.cache import LayerCache
from tests.helpers import FLOAT64_TOL, small_config
from variants import build

OWN_CODE = ("explicit", "einsum", "mathfirst", "fused")
# what each variant calls the encoder output in its decoder's forward (its source's word)
ENCODER_OUTPUT = {"memory", "encoder_output", "enc_out"}


def own_modules(model: nn.Module) -> dict[str, type[nn.Module]]:
    """Every module class of the model that the suite wrote (not torch's), by qualified name."""
    classes = {type(module) for module in model.modules()}
    return {f"{cls.__module__}.{cls.__qualname__}": cls for cls in classes
            if cls.__module__.startswith(("variants.", "common."))}


def parameters(method) -> list[inspect.Parameter]:
    """The parameters of a method as its class defines it, ``self`` left out."""
    return list(inspect.signature(method).parameters.values())[1:]


@pytest.mark.parametrize("name", OWN_CODE)
def test_no_forward_takes_a_cache_or_runs_without_the_encoder_output(name):
    classes = own_modules(build(name, small_config()))
    assert any("Decoder" in qualname for qualname in classes), "the decoder's classes were not found"
    for qualname, cls in classes.items():
        for param in parameters(cls.forward):
            annotation = str(param.annotation)
            assert "cache" not in param.name.lower() and "Cache" not in annotation, \
                f"{qualname}.forward takes {param.name}: {annotation}"
            if param.name in ENCODER_OUTPUT:  # a None default would be a second, cached mode
                assert param.default is inspect.Parameter.empty and "None" not in annotation, \
                    f"{qualname}.forward's {param.name} may be None: {param}"


def cache_signature(layer_class: type[nn.Module]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The shape of a decoder layer's cache methods: for ``start_cache`` and ``step`` the kind of
    each parameter, ``cache`` by name (the other names follow each source's words)."""

    def kinds(method) -> tuple[str, ...]:
        found = []
        for param in parameters(method):
            assert param.default is inspect.Parameter.empty, f"{method.__qualname__}: {param} has a default"
            assert param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, f"{method.__qualname__}: {param}"
            found.append("cache" if param.name == "cache" else "tensor")
        return tuple(found)

    return kinds(layer_class.start_cache), kinds(layer_class.step)


def test_every_decoder_layer_has_the_same_cache_methods():
    """start_cache(memory) and step(x, cache, src_mask, tgt_mask), in all four own-code variants."""
    expected = (("tensor",), ("tensor", "cache", "tensor", "tensor"))
    signatures = {name: cache_signature(type(build(name, small_config()).decoder.layers[0]))
                  for name in OWN_CODE}
    assert signatures == dict.fromkeys(OWN_CODE, expected)


@pytest.mark.parametrize("name", OWN_CODE)
def test_a_layer_step_grows_its_cache_by_one_position_and_equals_its_forward(name):
    """One position, no masks, float64: ``step`` from a fresh cache is ``forward`` on that one
    position; the self-attention keys and values grow by one position (B x D numbers, whatever
    the layout), the encoder output's stay as they are."""
    config = small_config(dropout=0.0)
    layer = build(name, config, seed=0).double().eval().decoder.layers[0]
    generator = torch.Generator().manual_seed(0)
    memory = torch.randn(3, 5, config.d_model, generator=generator, dtype=torch.float64)  # (B, S, D)
    x = torch.randn(3, 1, config.d_model, generator=generator, dtype=torch.float64)  # (B, 1, D)
    with torch.no_grad():
        cache = layer.start_cache(memory)
        assert isinstance(cache, LayerCache)
        assert cache.self_keys.numel() == cache.self_values.numel() == 0
        cross = cache.cross_keys.clone(), cache.cross_values.clone()
        stepped = layer.step(x, cache, None, None)
        # forward(x, <the encoder output, once or, as einsum's (value, key), twice>, masks)
        memory_uses = len(parameters(type(layer).forward)) - 3
        expected = layer(x, *[memory] * memory_uses, None, None)
    torch.testing.assert_close(stepped, expected, **FLOAT64_TOL)
    assert cache.self_keys.numel() == cache.self_values.numel() == 3 * config.d_model
    assert torch.equal(cache.cross_keys, cross[0]) and torch.equal(cache.cross_values, cross[1])
