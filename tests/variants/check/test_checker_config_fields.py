"""The checker under the config fields for checkpoints trained elsewhere (``activation``,
``final_norm``, ``positions``, ``decoder_d_ff``, ``decoder_start``): a row built with any of them
passes the battery against the reference built alike, each is an option of the command, and
what reads a feed-forward's width reads the decoder's own."""

from __future__ import annotations

import pytest

from common.weights import canonical_shapes
from tests.variants.check.test_checker_tutorials import concrete
from variants import variant_class
from variants.check import __main__ as command
from variants.check.__main__ import main
from variants.check.adapter import interfaced
from variants.check.battery import computation_order, run_battery
from variants.check.harness import CONFIG
from variants.check.patterns import as_python, weight_patterns
from variants.check.sites import HIDDEN, OUTPUT, place
from variants.check.suggest import draft

TUTORIAL = "tests.fixtures.outside.tutorial:Transformer"
# an opus-mt base model's choices, all at once
MARIAN_LIKE = dict(activation="silu", final_norm=False, positions="marian", decoder_start="pad",
                   norm_eps=1e-5, decoder_d_ff=64)


# one field at a time is slow: "all" (Marian's fields together), fairseq's positions and the EOS
# start, which "all" does not hold, run by default
ALONE = pytest.mark.slow


@pytest.mark.parametrize("changes", [
    pytest.param(dict(final_norm=False), marks=ALONE), pytest.param(dict(activation="silu"), marks=ALONE),
    pytest.param(dict(activation="gelu"), marks=ALONE), pytest.param(dict(decoder_d_ff=64), marks=ALONE),
    pytest.param(dict(positions="marian"), marks=ALONE), dict(positions="fairseq"),
    pytest.param(dict(decoder_start="pad"), marks=ALONE), dict(decoder_start="eos"), MARIAN_LIKE,
], ids=["no-final-norm", "silu", "gelu", "decoder-d-ff", "marian", "fairseq", "start-pad", "start-eos",
        "all"])
def test_a_row_built_with_each_field_passes_the_battery(changes):
    """explicit against the reference, both built with the field: every check of both modes
    passes (the gradient check once named a final norm the config has not; the sites check once
    read the decoder's hidden layer at the encoder's width)."""
    results = run_battery("explicit", config=CONFIG.replace(**changes))
    assert len(results) == 15
    assert [(r.check, r.detail) for r in results if r.passed is not True] == []


@pytest.mark.parametrize("final_norm", [True, False])
def test_the_gradients_are_read_in_order_of_computation_with_or_without_final_norms(final_norm):
    config = CONFIG.replace(final_norm=final_norm)
    order = computation_order(config)
    assert sorted(order) == sorted(canonical_shapes(config))
    k = order.index("tgt_embed.weight")
    assert all(name.startswith(("src_embed.", "encoder.")) for name in order[:k])
    assert all(name.startswith(("decoder.", "generator.")) for name in order[k + 1:])
    assert ("encoder.norm.weight" in order[:k]) is final_norm


def test_a_dropout_as_wide_as_the_decoders_own_ffn_is_its_hidden_layer():
    """Encoder d_ff 128, decoder 64: a (B, T, 64) drop before the decoder's feed-forward completes
    is its hidden layer, a (B, S, 128) one the encoder's; a d_model-wide one after it is its output."""
    config = CONFIG.replace(decoder_d_ff=64)
    events = [("drop", ((3, 7, 128), 0.3, False)), ("done", "encoder.layers.0.ff"),
              ("drop", ((3, 5, 64), 0.3, False)), ("done", "decoder.layers.0.ff"),
              ("drop", ((3, 5, 32), 0.3, False))]
    assert place(events, config, (3, 7, 5)) == [("encoder.layers.0.ff", HIDDEN, 0.3),
                                                ("decoder.layers.0.ff", HIDDEN, 0.3),
                                                ("decoder.layers.0.ff", OUTPUT, 0.3)]


OPTIONS = ["--no-final-norm", "--activation", "silu", "--decoder-d-ff", "64", "--positions", "marian",
           "--decoder-start", "pad", "--norm-eps", "1e-5"]


def test_each_field_is_an_option_the_battery_and_the_header_take(monkeypatch, capsys):
    seen = []
    real = command.run_battery

    def recording(spec, against, seed, config, *rest):
        seen.append(config)
        return real(spec, against, seed, config, *rest)

    monkeypatch.setattr(command, "run_battery", recording)
    assert main(["explicit", "--norm", "post", *OPTIONS]) == 0
    assert seen == [CONFIG.replace(**MARIAN_LIKE)]
    first, reference = capsys.readouterr().out.splitlines()[:2]
    assert first == ("explicit against torch: d_model 32, 4 heads, 2 layers, d_ff 128 (the decoder 64), "
                     "vocabularies 23 and 19, seed 0")
    for says in ("LayerNorm eps 1e-05", "no final LayerNorm", "SiLU feed-forward", "marian sinusoids"):
        assert says in reference, reference


@pytest.mark.parametrize(("options", "says"), [
    (["--activation", "swish"], "argument --activation: invalid choice: 'swish'"),
    (["--positions", "halves"], "argument --positions: invalid choice: 'halves'"),
    (["--decoder-start", "unk"], "argument --decoder-start: invalid choice: 'unk'"),
    (["--decoder-d-ff", "0"], "argument --decoder-d-ff: must be positive, got '0'"),
    (["--norm-eps", "inf"], "argument --norm-eps: must be positive and finite, got 'inf'"),
    (["--positions", "fairseq", "--d-model", "2", "--heads", "1"],
     "TransformerConfig.positions 'fairseq' needs d_model >= 4, got 2"),
], ids=["activation", "positions", "start", "decoder-d-ff", "eps", "fairseq-width"])
def test_a_bad_field_value_is_one_line_and_exit_2(options, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["explicit", *options])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("python -m variants.check: error: ") and says in line, line


def test_a_decoder_ffn_width_that_does_not_fit_points_at_the_decoders_option(capsys):
    """The tutorial builds both feed-forwards d_ff wide: asked for a decoder of 64, the map does not
    fit, and the hint names --decoder-d-ff, not --d-ff."""
    with pytest.raises(SystemExit) as exit_info:
        main([TUTORIAL, "--decoder-d-ff", "64"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith("hint: the model's decoder feed-forward width is 128: "
                                 "pass --decoder-d-ff 128")


def test_the_draft_reads_the_decoders_own_ffn_width():
    """explicit built with a decoder feed-forward of its own width: the draft is its written map;
    the tutorial, which ignores the field, gets a note naming the decoder's option."""
    config = CONFIG.replace(decoder_d_ff=64)
    cls = variant_class("explicit")
    shapes = canonical_shapes(config)
    assert concrete(weight_patterns(draft(interfaced(cls)(config), config)), shapes) == \
        concrete(cls.weight_map, shapes)
    text = as_python(draft(interfaced(variant_class(TUTORIAL))(config), config), config, "Transformer")
    assert ("# note: the feed-forward is 128 wide (decoder.layers.0), the config's decoder_d_ff 64: "
            "pass --decoder-d-ff 128") in text
