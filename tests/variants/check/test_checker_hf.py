"""The checker on a production implementation: Hugging Face's ``MarianMTModel`` behind the adapter
tests/fixtures/outside/hf_marian.py. Configured as an opus-mt model is, it passes, its float32
sinusoid table named as float32 rounding; held to a reference with final norms, the missing
norm is the first divergence, and explained; with Hugging Face's default attention, a source of
padding only is the one difference."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from tests.fixtures.outside.hf_marian import Marian
from variants.check.__main__ import main
from variants.check.adapter import drafting
from variants.check.battery import run_battery
from variants.check.harness import CONFIG
from variants.check.patterns import probe_patterns, weight_patterns
from variants.check.suggest import draft

SPEC = "tests.fixtures.outside.hf_marian:Marian"
# an opus-mt base model: swish, Marian's sinusoids, the padding id first, eps 1e-5, tied embeddings
TIED = ["--share-embeddings", "--activation", "silu", "--positions", "marian", "--decoder-start", "pad",
        "--norm-eps", "1e-5"]
ALIKE = [*TIED, "--no-final-norm"]
OPUS_MT = CONFIG.replace(activation="silu", final_norm=False, positions="marian", decoder_start="pad",
                         norm_eps=1e-5)


def test_marian_configured_alike_passes_its_float32_table_named(capsys):
    assert main([SPEC, *ALIKE]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith(("forward", "gradients", "3 Adam",
                                                                          "dropout sites", "fully", "bad"))]
    assert len(rows) == 8 and all("pass" in row for row in rows), out
    assert "norm modes checked: post-norm; pre-norm: not supported: Marian.norm_modes is ('post',)" in out
    assert "declared absent (None in the weight map): 1 biases, held at zero in both models" in out
    assert ("float32 rounding, Marian's frozen parameter marian.model.encoder.embed_positions.weight holds "
            "float32 values (a table computed in float32, then cast up)") in out
    assert out.rstrip().splitlines()[-1] == ("every check passes; 4 of them within float32 rounding only, "
                                             "which the model carries (the note above)")


def test_marian_untied_with_relu_and_two_vocabularies_passes():
    """opus-mt-tc-big's shape: ReLU, a source and a target vocabulary; the same adapter and maps."""
    results = run_battery(SPEC, config=OPUS_MT.replace(activation="relu"), modes=("post",))
    assert [(r.check, r.detail) for r in results if r.passed is not True] == []
    assert sum(r.precision for r in results) == 4


def test_a_reference_with_final_norms_names_the_one_marian_lacks(capsys):
    assert main([SPEC, *TIED]) == 1
    located, explained = capsys.readouterr().out.rstrip().splitlines()[-2:]
    assert located.startswith("first divergence: encoder.norm (absent in Marian: compared at "
                              "marian.model.encoder.layers.1's output; max |Δ| "), located
    assert located.endswith(" (float32 rounding)"), located
    assert explained.startswith("explained: no LayerNorm here: the value is its input, unnormalised; "
                                "recomputed so, encoder.norm matches the model to "), explained


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_with_sdpa_attention_a_source_of_padding_only_is_the_one_difference(capsys):
    """F.scaled_dot_product_attention gives a fully masked row zeros where the suite's is the
    uniform average (docs/numerics.md); every other check passes."""
    results = run_battery("tests.fixtures.outside.hf_marian:Sdpa", config=OPUS_MT, modes=("post",))
    assert [r.check for r in results if r.passed is not True] == [
        "fully masked source row post-norm vs explicit"]
    assert main(["tests.fixtures.outside.hf_marian:Sdpa", *ALIKE]) == 1
    located, last = capsys.readouterr().out.rstrip().splitlines()[-2:]
    assert located.startswith("first divergence: encoder.layers.0.self_attn (max |Δ| "), located
    assert located.endswith("); no point before it is probed"), located
    assert last.startswith("encoder.layers.0.self_attn differs only in batch row 1, whose source is padding "
                           "only (every attention over it fully masked), where the model puts "), last


@pytest.mark.parametrize("final_norm", [True, False])
def test_the_adapters_maps_are_the_draft(final_norm):
    """What --suggest-maps prints for the class, with or without final norms in the config."""
    config = OPUS_MT.replace(final_norm=final_norm)
    found = draft(drafting(Marian)(config), config)
    assert weight_patterns(found) == Marian.weight_map
    assert probe_patterns(found) == Marian.probe_map
    assert tuple(found.unplaced) == Marian.extra_parameters
