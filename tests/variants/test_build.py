"""The registry builds every variant by name, behind one interface."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.config import TransformerConfig
from common.interface import EncoderDecoder
from tests.helpers import small_config
from variants import FROM_SCRATCH, REFERENCE, TEACHING, VARIANTS, build


def test_registry_lists_the_reference_last():
    assert VARIANTS[0] == "explicit" and VARIANTS[-1] == "torch"
    assert len(set(VARIANTS)) == len(VARIANTS)


def test_registry_names_the_reference_and_the_variants_written_from_scratch():
    """One home for the rows' roles: the reference is nn.Transformer's row, every other registered
    variant is from scratch, and the three source styles are the teaching ones."""
    assert REFERENCE == "torch" == VARIANTS[-1]
    assert FROM_SCRATCH == ("explicit", "einsum", "mathfirst", "fused")
    assert TEACHING == ("explicit", "einsum", "mathfirst")
    assert not build(REFERENCE, small_config()).has_cache  # the one row that decodes by recompute
    assert all(build(name, small_config()).has_cache for name in FROM_SCRATCH)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown variant 'nope'") as error:
        build("nope", small_config())
    assert all(name in str(error.value) for name in VARIANTS)


CHECKER_LOADED = """
import sys, variants
from common.config import TransformerConfig
config = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, src_vocab_size=11, tgt_vocab_size=11)
variants.build({name!r}, config)
print(sorted(m for m in sys.modules if m.startswith("variants.check")))
"""


@pytest.mark.parametrize(("name", "loaded"), [
    ("explicit", False), pytest.param("torch", False, marks=pytest.mark.slow),  # a second registered row
    ("tests.fixtures.outside.tutorial:Transformer", True),
], ids=["explicit", "torch", "outside"])
def test_the_checker_loads_only_for_an_outside_class(name, loaded):
    """``import variants`` and building a registered variant leave the checker (variants/check/)
    unloaded; an outside spec loads its adapter. A fresh interpreter: this one has the checker."""
    done = subprocess.run([sys.executable, "-c", CHECKER_LOADED.format(name=name)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2], check=True)
    modules = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert bool(modules) is loaded, modules
    if loaded:
        assert "variants.check.outside" in modules and "variants.check.battery" not in modules


def test_config_must_be_a_transformer_config():
    with pytest.raises(TypeError, match="TransformerConfig"):
        build("explicit", {"d_model": 32})


def test_interface_shapes(variant):
    config = small_config()
    model = build(variant, config, seed=0).eval()
    assert isinstance(model, EncoderDecoder) and model.config is config
    src = torch.randint(1, config.src_vocab_size, (2, 6))
    tgt = torch.randint(1, config.tgt_vocab_size, (2, 4))
    with torch.no_grad():
        memory = model.encode(src)
        hidden = model.decode(tgt, memory)
        log_probs = model.project(hidden)
    assert memory.shape == (2, 6, config.d_model)
    assert hidden.shape == (2, 4, config.d_model)
    assert log_probs.shape == (2, 4, config.tgt_vocab_size)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 4))


COUNT_CONFIG = TransformerConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, src_vocab_size=50,
                                 tgt_vocab_size=40)


def test_parameter_count_is_the_same_in_every_variant(subject_variant):
    count = sum(p.numel() for p in build(subject_variant, COUNT_CONFIG).parameters())
    reference = sum(p.numel() for p in build(REFERENCE, COUNT_CONFIG).parameters())
    assert count == reference


def test_parameter_count_is_the_architectures(variant):
    """Counted from the one architecture (docs/architecture.md), the reference included: two embedding tables,
    per encoder layer one attention (four D x D projections with bias), a D-F-D feed-forward
    and two LayerNorms, per decoder layer two attentions and three LayerNorms, two final
    LayerNorms and the generator with its bias."""
    d, f, n = 32, 64, 2
    attention = 4 * (d * d + d)
    feed_forward = (d * f + f) + (f * d + d)
    norm = 2 * d
    expected = ((50 + 40) * d + n * (attention + feed_forward + 2 * norm)
                + n * (2 * attention + feed_forward + 3 * norm) + 2 * norm + (40 * d + 40))
    assert expected == 47_080  # 2,880 + 2 x 8,544 + 2 x 12,832 + 128 + 1,320
    assert sum(p.numel() for p in build(variant, COUNT_CONFIG).parameters()) == expected


def test_dropout_is_active_in_training_only(variant):
    config = small_config(dropout=0.5)
    model = build(variant, config, seed=0)
    src = torch.randint(1, config.src_vocab_size, (2, 6))
    tgt = torch.randint(1, config.tgt_vocab_size, (2, 4))
    with torch.no_grad():
        model.train()
        assert not torch.equal(model(src, tgt), model(src, tgt))
        model.eval()
        assert torch.equal(model(src, tgt), model(src, tgt))


class CountCalls(torch.overrides.TorchFunctionMode):
    """Counts calls of one torch function."""

    def __init__(self, function) -> None:
        super().__init__()
        self.function, self.count = function, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += func is self.function
        return func(*args, **(kwargs or {}))


def test_forward_checks_each_id_tensor_once(variant):
    """forward validates its inputs once: the stages it composes do not check them again."""
    config = small_config()
    model = build(variant, config, seed=0).eval()
    src = torch.randint(1, config.src_vocab_size, (2, 6))
    tgt = torch.randint(1, config.tgt_vocab_size, (2, 4))
    with torch.no_grad(), CountCalls(torch.aminmax) as counter:
        model(src, tgt)
    assert counter.count == 2  # the id-range check of src and of tgt
