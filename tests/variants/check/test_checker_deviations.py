"""``python -m variants.check`` on models in the shapes learners copy, each carrying one deviation
such models commonly have: checked in the norm modes the class supports, the real bug named
rather than float32 rounding, failing training checks explained, errors traced to the model's own
line with a hint, and docs/results/check-deviations.md's table of what the checker prints for each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from common.interface import EncoderDecoder
from common.random_batch import random_batch
from tests.fixtures.outside import sublayers, tutorial
from tests.helpers import FLOAT64_TOL
from variants import REFERENCE, SpecError, build
from variants.check.__main__ import main
from variants.check.battery import forward, gradients, run_battery
from variants.check.diagnose import locate, still_drops
from variants.check.divergence import first_divergence, precision_notes
from variants.check.harness import CONFIG, Case, absent_line
from variants.check.tolerances import FLOAT64

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = "tests.fixtures.outside"
SMALL = CONFIG.replace(n_layers=1, d_ff=64)  # the component tests' model: one layer per stack
PRE = SMALL.replace(norm_first=True)

# deviation -> (the fixture that carries it, the exit status, a line the checker prints for it);
# docs/results/check-deviations.md's table lists the same, with the digits of the default config
DEVIATIONS = {
    'a sinusoid table built in float32': (
        f"{FIXTURES}.sublayers:Float32Table", 0,
        "float32 rounding only: src_embed differs by 6.7e-08: float32 rounding, Float32Table's buffer "
        "src_embed.1.pe holds float32 values"),
    'LayerNorm of the std, eps outside the root': (
        f"{FIXTURES}.bugs:Source1LayerNorm", 1,
        'first divergence: encoder.layers.0.norm1 (max |Δ| 0.05)'),
    'scores scaled by √d_model (or √embed_size)': (
        f"{FIXTURES}.bugs:ScaledBySqrtDModel", 1,
        'first divergence: encoder.layers.0.self_attn (max |Δ| 0.67)'),
    'one head-sized projection shared by all heads': (
        f"{FIXTURES}.bugs:OneProjectionForAllHeads", 1,
        'first divergence: encoder.layers.0.self_attn (max |Δ| 2.7)'),
    'learned positions': (
        f"{FIXTURES}.bugs:LearnedPositions", 1,
        'first divergence: src_embed (max |Δ| 3)'),
    'learned positions, embeddings not scaled by √d_model': (
        f"{FIXTURES}.bugs:LearnedPositionsUnscaled", 1,
        'first divergence: src_embed (max |Δ| 6.2)'),
    "the decoder's final norm built, never applied": (
        f"{FIXTURES}.bugs:NoFinalDecoderNorm", 1,
        'first divergence: decoder.norm (not computed by NoFinalDecoderNorm)'),
    'cross-attention keys and values swapped': (
        f"{FIXTURES}.bugs:SwappedCrossKeysValues", 1,
        'first divergence: decoder.layers.1.cross_attn (max |Δ| 4.4)'),
    'attention projections without biases': (
        f"{FIXTURES}.blocks:Checked", 0,
        'declared absent (None in the weight map): 24 biases, held at zero in both models'),
    'no final LayerNorms': (
        f"{FIXTURES}.blocks:NoFinalNorms", 1,
        'explained: no LayerNorm here: the value is its input, unnormalised'),
    'no final LayerNorms, probe map None': (
        f"{FIXTURES}.blocks:NoFinalNormsUnprobed", 1,
        "first divergence: encoder.norm (absent in NoFinalNormsUnprobed: compared at "
        "model.encoder.layers.1's output; max |Δ| 3.6)"),
    'dropout not wired through to attention': (
        f"{FIXTURES}.sublayers:UnwiredDropout", 1,
        'encoder.layers.0.self_attn.dropout (Dropout(p=0.1, inplace=False)) still drops'),
    'pre-norm only': (
        f"{FIXTURES}.sublayers:Checked", 0,
        'norm modes checked: pre-norm; post-norm: not supported: pre-norm only'),
    'another LayerNorm eps': (
        f"{FIXTURES}.blocks:LayerNormEps", 1,
        "explained: LayerNorm eps 1e-05 (nn.LayerNorm's default) where the reference's is 1e-06"),
    'LayerNorm eps 1e-12, float64 throughout': (
        f"{FIXTURES}.residual:Eps1e12", 1,
        'first divergence: encoder.layers.0.norm1 (max |Δ| 1.1e-06); everything before it agrees to 1.3e-15'),
    'a LayerNorm between embedding and first layer': (
        f"{FIXTURES}.residual:EmbeddingNorm", 1,
        'explained: a LayerNorm (eps 1e-06, gain 1, shift 0) on the embeddings before the first layer'),
    'logits, not log-probabilities': (
        f"{FIXTURES}.residual:Logits", 1,
        "hint: the rows' logsumexp is up to 4, not 0: logits, not log-probabilities"),
    'masked scores filled with -inf': (
        f"{FIXTURES}.residual:InfFill", 1,
        'hint: NaN at 5 positions: masked scores are filled with -inf'),
    'a flat (B·T, V) output': (
        f"{FIXTURES}.residual:Flat", 1,
        'shape (15, 19), expected (3, 5, 19); hint: a flat (B·T, V) output'),
    "`padding_idx` at the tutorial's pad id, 1": (
        f"{FIXTURES}.residual:PadAtOne", 1,
        "row 1 of tgt_embed.weight's gradient is zero where the reference's is not"),
    'no dropout on the attention weights': (
        f"{FIXTURES}.residual:NoAttentionDropout", 1,
        'missing dropout: encoder.layers.0.self_attn (attention weights)'),
    "no dropout on the feed-forward's hidden layer": (
        f"{FIXTURES}.residual:NoHiddenDropout", 1,
        'missing dropout: encoder.layers.0.ff (hidden layer)'),
    'the feed-forward width hard-wired (2048)': (
        f"{FIXTURES}.residual:HardWiredWidth", 2,
        'pass --d-ff 2048'),
    'no maps written': (
        f"{FIXTURES}.residual:Checked", 0,
        "maps: inferred from Checked's modules"),
    'encode and decode, no project': (
        f"{FIXTURES}.tokens:NoProject", 0,
        'protocol: forward only (it defines encode and decode but no project)'),
    'decode(memory, src_mask, tgt, tgt_mask)': (
        f"{FIXTURES}.blocks:MemoryFirstDecode", 2,
        'MemoryFirstDecode.decode takes (encoder_output, src_mask, tgt, tgt_mask), '
        'but the suite calls decode(tgt, memory, src_mask, tgt_mask)'),
    'decode(trg_token_ids_batch, src_representations_batch, trg_mask, src_mask)': (
        f"{FIXTURES}.tokens:TutorialDecodeOrder", 2,
        'but the suite calls decode(tgt, memory, src_mask, tgt_mask)'),
    'the same under names the checker cannot read': (
        f"{FIXTURES}.blocks:UnreadableDecodeOrder", 1,
        'hint: an embedding got a mask or hidden states for ids: check the argument order'),
    'masks laid out (B, 1, S) and (B, T, T)': (
        f"{FIXTURES}.sublayers:ThreeAxisMasks", 1,
        'hint: check the masks: the suite passes src_mask (B, 1, 1, S) and tgt_mask (B, 1, T, T)'),
    'decoder masks swapped': (
        f"{FIXTURES}.tokens:SwappedMasks", 1,
        'hint: with src_mask and tgt_mask exchanged in decode the model runs'),
    'embeddings tied to the generator': (
        f"{FIXTURES}.tokens:Tied", 2,
        'check a tied model against the tied reference with --share-embeddings'),
    'the same, checked as tied': (
        f"{FIXTURES}.tokens:Tied --share-embeddings", 0,
        'vocabularies 23 and 23 (shared, tied to the generator)'),
    "per-head `Linear(D, D/H)` lists, own names, a float32 table, the paper's dropout": (
        f"{FIXTURES}.blog:Checked --dropout-sites paper", 0,
        'every check passes; 4 of them within float32 rounding only'),
    "the same, against `torch.nn.Transformer`'s dropout sites": (
        f"{FIXTURES}.blog:Checked", 1,
        "hint: these are the paper's sites (section 5.4) exactly: check against them with "
        "--dropout-sites paper"),
    "per-head attention dropout too (`torch.nn.Transformer`'s sites)": (
        f"{FIXTURES}.blog:TorchSites", 0,
        "dropout: 0 in every check but the sites check (p=0.3, against torch.nn.Transformer's sites)"),
    "each head's scores divided by √d_model": (
        f"{FIXTURES}.blog:ScaledBySqrtDModel", 1,
        "explained: the scores are divided by √d_model = √32 where the reference divides by √d_k = √8: a "
        "factor √H = √(d_model/d_k) = 2 smaller"),
    "`nn.LayerNorm` at its default eps": (
        f"{FIXTURES}.blog:LayerNormEps", 1,
        "explained: LayerNorm eps 1e-05 (nn.LayerNorm's default) where the reference's is 1e-06"),
    "per-head (B, T, S) scores given the suite's 4-D masks": (
        f"{FIXTURES}.blog:Broadcasting", 1,
        "hint: the output is (3, 3, 5, 19) where the reference's is (3, 5, 19): masked_fill at "
        "tests/fixtures/outside/blog.py:51 in forward broadcast a (3, 7, 7) tensor against a (3, 1, 1, 7) "
        "mask"),
    "layers returning `(output, attention)`, learned positions, no final norms": (
        f"{FIXTURES}.tuples:Checked", 1,
        "explained: learned positions: rows of the model's own encoder.pos_embedding.weight added where the "
        "reference adds the sinusoids"),
    "the same with the sinusoids: no final norms": (
        f"{FIXTURES}.tuples:Sinusoids", 1,
        "first divergence: encoder.norm (absent in Sinusoids: compared at encoder.layers.1's output; "
        "max |Δ| 1)"),
    'norms registered in another order than the layer calls them, no maps': (
        f"{FIXTURES}.library:Checked", 0,
        "maps: inferred from Checked's modules"),
    "a map that sends each norm to the other's module": (
        f"{FIXTURES}.library:SwappedNorms", 1,
        "explained: encoder.layers.0.norm1 holds encoder.layers.0.norm2's gain and shift"),
    'a map that exchanges W_q and W_k': (
        f"{FIXTURES}.library:SwappedQueryKey", 1,
        'explained: W_q and W_k exchanged'),
    'E[ids] not scaled, the sinusoids times a learned d_model^-1/2': (
        f"{FIXTURES}.library:ScaledSinusoids", 1,
        'explained: two departures together at the embeddings: the embeddings not scaled by √d_model = √32; '
        'and the positions scaled by 1/√d_model = 0.177'),
    'eps 1e-5 and no shift in one LayerNorm': (
        f"{FIXTURES}.library:EpsNoShift", 1,
        "explained: two departures together in the LayerNorm: eps 1e-05 (nn.LayerNorm's default) where the "
        "reference's is 1e-06, and no shift (bias)"),
    "each attention's output zero at padded queries": (
        f"{FIXTURES}.library:PaddedZeros", 1,
        'hint: only the 3 padded target positions (tgt == pad_id 0) differ'),
    "a fully masked row's attention weights all zero": (
        f"{FIXTURES}.library:MaskedRowZeros", 1,
        'hint: only batch row 1, whose source is padding only, differs'),
    'pre-norm whatever the config says, undeclared': (
        f"{FIXTURES}.library:Undeclared", 1,
        'it passes as pre-norm; declare norm_modes = ("pre",) on the class'),
    "a float32 table and the attention's softmax in float32": (
        f"{FIXTURES}.library:Float32", 0,
        "Float32's attention softmax runs in float32 (a cast before it)"),
    'a learned scalar on the sinusoids, initialised to 1': (
        f"{FIXTURES}.library:TrainedScale", 1,
        'the model trains parameters the reference does not have (extra_parameters): pos_scale'),
    "each attention's linears in one unnamed list, the keys' first, no maps": (
        f"{FIXTURES}.library:ListedKeysFirst", 1,
        "cause (encoder.layers.0.self_attn): W_q and W_k exchanged"),
    "the same, its maps drafted and run": (
        f"{FIXTURES}.library:ListedKeysFirst --suggest-maps", 0,
        "# corrected: as drafted, the forward diverged at encoder.layers.0.self_attn"),
}
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def digits_free(text: str) -> str:
    """``text`` with every number written as #: the points and words, not the last digits."""
    return NUMBER.sub("#", text)


def line_of(module, text: str) -> int:
    """The line of ``module``'s source that contains ``text`` (found by reading it)."""
    lines = Path(module.__file__).read_text(encoding="utf-8").splitlines()
    (number,) = [n for n, line in enumerate(lines, 1) if text in line]
    return number


def first_case(spec_config, dtype=torch.float64) -> Case:
    return Case(REFERENCE, spec_config, dtype, random_batch(spec_config, 3, 7, 5).inputs(), FLOAT64)


# --- 1. the forward-only protocol keeps the model's own methods ------------------------------


def test_a_forward_only_subclass_reaches_its_own_encode_and_decode():
    """sublayers.Checked's forward calls its own encode and decode(memory, src_mask, tgt, tgt_mask):
    built behind the interface, it computes the reference's log-probabilities."""
    spec = f"{FIXTURES}.sublayers:Checked"
    model = build(spec, PRE, seed=0).double().eval()
    reference = build(REFERENCE, PRE, seed=0).double().eval()
    assert isinstance(model, EncoderDecoder) and isinstance(model, sublayers.EncoderDecoder)
    inputs = random_batch(PRE).inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), reference(*inputs), **FLOAT64_TOL)
        memory = model.encode(inputs[0], inputs[2])  # its own encode, its own decode order
        assert model.decode(memory, inputs[2], inputs[1], inputs[3]).shape == (*inputs[1].shape, PRE.d_model)


# --- 2. norm modes ----------------------------------------------------------------------------


def test_a_mode_a_class_does_not_support_is_one_row_not_a_failure():
    results = run_battery(f"{FIXTURES}.blocks:Checked", config=SMALL)  # declares norm_modes = ("pre",)
    unsupported = [r for r in results if r.passed is None]
    assert [(r.check, r.detail) for r in unsupported] == [
        ("post-norm: every check", "not supported: Checked.norm_modes is ('pre',)")]
    assert all(r.passed for r in results if r.passed is not None)
    assert {r.config.norm_first for r in results if r.passed is not None} == {True}
    assert any(r.check == "fully masked source row pre-norm vs explicit" for r in results)


def test_asking_only_for_a_mode_a_class_refuses_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([f"{FIXTURES}.sublayers:Checked", "--norm", "post", "--layers", "1"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("can be built in none of the norm modes asked for (post-norm not supported: "
                         "pre-norm only: each SublayerConnection normalises first)")


# --- 3. precision against structure ------------------------------------------------------------


def test_a_float32_table_is_noted_and_the_later_bug_named():
    differences = locate(f"{FIXTURES}.sublayers:Float32TableStdNorm", first_case(PRE))
    line = first_divergence(differences, FLOAT64.atol)
    assert line.startswith("first divergence: encoder.layers.0.norm1 (max |Δ| "), line
    assert line.endswith("(float32 rounding)")
    (note,) = precision_notes(differences, FLOAT64.atol)
    line = line_of(sublayers, "self.pe[: x.shape[1]]")
    table = (r"Float32TableStdNorm's buffer (src|tgt)_embed\.1\.pe holds float32 values \(a table computed "
             rf"in float32, then cast up\), at tests/fixtures/outside/sublayers\.py:{line} in forward")
    assert re.fullmatch(rf"src_embed differs by \S+: float32 rounding, {table}; {table}", note), note
    assert "src_embed.1.pe" in note and "tgt_embed.1.pe" in note  # every source, not the first
    table_difference = differences[0].max_abs
    assert 1e-9 < table_difference < 1e-6  # float32's rounding of values of order one, not 0


def test_a_float32_table_alone_is_precision_only():
    differences = locate(f"{FIXTURES}.sublayers:Float32Table", first_case(PRE))
    assert first_divergence(differences, FLOAT64.atol).startswith("no divergence past float32 rounding")
    assert precision_notes(differences, FLOAT64.atol)[0].startswith("src_embed differs by ")


# --- 4. failing training checks explained; absent weights ------------------------------------


def test_dropout_left_on_fails_the_gradients_and_the_probe_names_the_module():
    spec = f"{FIXTURES}.sublayers:UnwiredDropout"
    assert forward(spec, first_case(PRE), 0, "forward").passed  # eval mode: no dropout
    result = gradients(spec, REFERENCE, PRE, 0)
    assert result.passed is False
    assert re.fullmatch(r"first differs at \S+ \(max \|Δ\| \S+\)", result.detail), result.detail
    assert still_drops(spec, PRE) == "encoder.layers.0.self_attn.dropout (Dropout(p=0.1, inplace=False))"
    assert still_drops(f"{FIXTURES}.sublayers:Checked", PRE) is None


def test_biases_declared_absent_are_zero_in_both_and_left_out_of_the_gradients():
    spec = f"{FIXTURES}.blocks:Checked"
    results = run_battery(spec, config=SMALL, modes=("pre",))
    assert all(r.passed for r in results), [(r.check, r.detail) for r in results if not r.passed]
    assert absent_line(spec, PRE).startswith("declared absent (None in the weight map): 12 biases, held at "
                                             "zero in both models")


def test_weights_declared_absent_stay_a_real_difference():
    spec = f"{FIXTURES}.blocks:NoFinalNorms"
    assert "2 weights, compared as they are" in absent_line(spec, PRE)
    line = first_divergence(locate(spec, first_case(PRE)), FLOAT64.atol)
    assert line.startswith("first divergence: encoder.norm ("), line


# --- 5. signatures and errors inside the model ----------------------------------------------


def test_a_decode_in_another_readable_order_is_refused_with_the_expected_one():
    with pytest.raises(SpecError, match=re.escape(
            "MemoryFirstDecode.decode takes (encoder_output, src_mask, tgt, tgt_mask), but the suite "
            "calls decode(tgt, memory, src_mask, tgt_mask): put its arguments in that order, or wrap it")):
        build(f"{FIXTURES}.blocks:MemoryFirstDecode", PRE)


@pytest.mark.parametrize(("spec", "module", "source", "hint"), [
    ("blocks:UnreadableDecodeOrder", "blocks", "return self.embedding(x) * math.sqrt(self.d_model)",
     "hint: an embedding got a mask or hidden states for ids: check the argument order; the suite calls "
     "encode(src, src_mask), decode(tgt, memory, src_mask, tgt_mask), forward(src, tgt, src_mask, tgt_mask)"),
    ("sublayers:ThreeAxisMasks", "sublayers", "return x + self.dropout(sublayer(self.norm(x)))",
     "hint: check the masks: the suite passes src_mask (B, 1, 1, S) and tgt_mask (B, 1, T, T), bool, "
     "True = may attend; a model written for (B, 1, S) masks adds an axis of its own"),
], ids=["argument order", "mask layout"])
def test_an_error_inside_the_model_names_its_line_and_the_likely_cause(spec, module, source, hint):
    result = run_battery(f"{FIXTURES}.{spec}", config=SMALL, modes=("pre",))[0]
    fixture = {"blocks": __import__(f"{FIXTURES}.blocks", fromlist=["x"]), "sublayers": sublayers}[module]
    assert result.passed is False
    assert f"(at tests/fixtures/outside/{module}.py:{line_of(fixture, source)} in forward); {hint}" \
        in result.detail, result.detail


# --- 6. the config ------------------------------------------------------------------------------


class ForwardExpansion(tutorial.Transformer):
    """The feed-forward width written as forward_expansion * d_model, an integer expansion."""

    def __init__(self, config) -> None:
        super().__init__(config)
        forward_expansion = config.d_ff // config.d_model
        for layer in [*self.encoder.layers, *self.decoder.layers]:
            layer.feed_forward.w_1 = nn.Linear(config.d_model, forward_expansion * config.d_model)
            layer.feed_forward.w_2 = nn.Linear(forward_expansion * config.d_model, config.d_model)


def test_the_default_d_ff_is_a_multiple_of_d_model_and_an_expansion_model_builds():
    assert CONFIG.d_ff % CONFIG.d_model == 0
    build(f"{__name__}:ForwardExpansion", CONFIG)
    with pytest.raises(SpecError, match=r"sends encoder\.layers\.0\.ff\.w1\.weight \(48, 32\)"):
        build(f"{__name__}:ForwardExpansion", CONFIG.replace(d_ff=48))


def test_the_config_is_chosen_on_the_command_line_and_printed(capsys):
    assert main([f"{FIXTURES}.tutorial:Transformer", "--d-model", "16", "--heads", "2", "--layers", "1",
                 "--d-ff", "32", "--vocab", "11", "13", "--norm", "post"]) == 0
    out = capsys.readouterr().out
    first, reference, dropout, modes = out.splitlines()[:4]
    assert first == (f"{FIXTURES}.tutorial:Transformer against torch: d_model 16, 2 heads, 1 layer, d_ff 32, "
                     "vocabularies 11 and 13, seed 0")
    assert reference.startswith("reference (torch): post-norm x = norm(x + sublayer(x)) or pre-norm ")
    assert "LayerNorm eps 1e-06 (biased variance, inside the root)" in reference
    assert "ReLU feed-forward, scores ÷ √d_k = √8" in reference
    assert dropout == ("dropout: 0 in every check but the sites check (p=0.3, against "
                       "torch.nn.Transformer's sites)")
    assert modes == "norm modes checked: post-norm"
    with pytest.raises(SystemExit) as exit_info:
        main([f"{FIXTURES}.tutorial:Transformer", "--heads", "5"])
    assert exit_info.value.code == 2
    assert "d_model (32) must be divisible by n_heads (5)" in capsys.readouterr().err


@pytest.mark.parametrize("vocab", [("1", "1"), ("2", "1"), ("1", "19")])
def test_a_vocabulary_too_small_for_the_battery_is_one_line_and_exit_2(vocab, capsys):
    """The battery's batches hold padding (id 0) and real tokens: a vocabulary of one id has no
    real token to draw, refused before any build."""
    with pytest.raises(SystemExit) as exit_info:
        main(["explicit", "--vocab", *vocab])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("python -m variants.check: error: --vocab must be at least 2 each") and \
        f"got {' '.join(vocab)}" in line, line
    with pytest.raises(ValueError, match=r"vocabularies of at least 2 ids each .* got 1 and 19"):
        run_battery("explicit", config=CONFIG.replace(src_vocab_size=1, tgt_vocab_size=19))


@pytest.mark.parametrize("seed", [str(2**64), "-1"])
def test_a_seed_out_of_range_is_one_line_and_exit_2(seed, capsys):
    """torch's generator refuses a seed past 2**64 - 1 ("Overflow when unpacking long long"), after
    the battery has started: refused up front, in the range every consumer takes."""
    with pytest.raises(SystemExit) as exit_info:
        main(["explicit", "--seed", seed])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--seed: must be a seed in 0..4294967295 (2**32 - 1), got {seed}" in line, line


def test_the_help_states_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for default in ("(default 32)", "(default 4)", "(default 2)", "(default 128, 4 × d_model)",
                    "(default 23 19)", "(default both)"):
        assert default in out


# --- every deviation end to end, and the docs' table --------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("deviation", DEVIATIONS,
                         ids=[spec.rpartition(".")[2].replace(" --", "-").replace(" ", "-")
                              for spec, _, _ in DEVIATIONS.values()])
def test_each_deviation_end_to_end(deviation, capsys):
    """``python -m variants.check SPEC``; post-norm only where the class supports both modes (the
    finder explains the first post-norm check either way), to keep the run short."""
    spec, status, says = DEVIATIONS[deviation]
    spec, *options = spec.split()
    both_modes = spec.partition(":")[0].endswith(".bugs")
    try:
        code = main([spec, *options, *(["--norm", "post"] if both_modes else [])])
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    assert code == status
    assert digits_free(says) in digits_free(captured.out + captured.err), captured.out + captured.err


def test_the_docs_table_of_deviations_is_the_fixtures():
    """docs/results/check-deviations.md lists every deviation here: the fixture, the exit status and
    the line."""
    page = (ROOT / "docs" / "results" / "check-deviations.md").read_text(encoding="utf-8").replace("\\|", "|")
    rows = re.findall(r"^\| (.+?) \| `(\S+:\w+(?: --[\w-]+(?: [a-z]+)?)*)` \| (\d) \| `([^`]+)` \|$", page,
                      flags=re.M)
    assert {deviation: (f"{FIXTURES}.{spec}", int(status), says) for deviation, spec, status, says in rows} \
        == DEVIATIONS
