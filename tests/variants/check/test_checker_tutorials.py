"""``python -m variants.check`` on more tutorial-shaped models (tests/fixtures/outside/residual.py,
tokens.py): float32 rounding judged from evidence, declared-absent points probed where they
would be, gradients explained, the classic mistakes hinted, dropout sites compared, and maps
drafted for the user."""

from __future__ import annotations

import math
import re
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.probes import Probe
from common.random_batch import random_batch
from common.weights import Param, canonical_shapes, match_patterns
from tests.fixtures.outside import blocks, residual, sublayers, tutorial
from variants import REFERENCE, SpecError, build, variant_class
from variants.check.__main__ import main
from variants.check.adapter import interfaced
from variants.check.battery import dropout_sites, forward, gradients, masked_batch, run_battery
from variants.check.diagnose import locate
from variants.check.divergence import PointDifference, first_divergence, precision_notes
from variants.check.harness import CONFIG, Case
from variants.check.outside import role_of
from variants.check.patterns import as_python, probe_patterns, weight_patterns
from variants.check.suggest import draft
from variants.check.tolerances import FLOAT64

FIXTURES = "tests.fixtures.outside"
SMALL = CONFIG.replace(n_layers=1)
POST, PRE = CONFIG, CONFIG.replace(norm_first=True)


def first_case(config, dtype=torch.float64) -> Case:
    return Case(REFERENCE, config, dtype, random_batch(config, 3, 7, 5).inputs(), FLOAT64)


# --- 1. rounding against structure, from evidence ------------------------------------------


def test_a_float64_model_with_another_eps_is_structure_not_rounding():
    """eps 1e-12 in a model with no float32 anywhere: ~1e-6 at the first norm, within 4x the
    reference's own float32 rounding there, but no float32 is on the path, so it is the bug."""
    differences = locate(f"{FIXTURES}.residual:Eps1e12", first_case(POST))
    norm1 = next(d for d in differences if d.point == "encoder.layers.0.norm1")
    assert 1e-8 < norm1.max_abs < 1e-4 and norm1.float32_seen is False
    assert precision_notes(differences, FLOAT64.atol) == []
    line = first_divergence(differences, FLOAT64.atol)
    assert line.startswith("first divergence: encoder.layers.0.norm1 (max |Δ| "), line
    assert float(line.rpartition(" ")[2]) < 1e-13  # what precedes it agrees to float64 rounding


def test_the_agrees_to_bound_is_never_larger_than_the_divergence_named():
    differences = [PointDifference("a", 0.0, rounding=1e-6, float32_seen=True),
                   PointDifference("b", 2.8e-6, rounding=1e-6, float32_seen=True),  # rounding: 2.8 < 4 x 1
                   PointDifference("c", 2e-6, rounding=1e-7, float32_seen=True)]  # past 4 x 1e-7
    assert first_divergence(differences, 1e-10) == (
        "first divergence: c (max |Δ| 2e-06); every point before it is within float32 rounding "
        "(up to 2.8e-06)")
    # without evidence of float32 on the path, b is the divergence itself
    differences[1] = PointDifference("b", 2.8e-6, rounding=1e-6, float32_seen=False)
    assert first_divergence(differences, 1e-10).startswith("first divergence: b (max |Δ| 2.8e-06)")


def test_a_float32_table_stays_rounding_because_its_values_are_float32():
    differences = locate(f"{FIXTURES}.sublayers:Float32Table", first_case(PRE.replace(n_layers=1)))
    assert differences[0].float32_seen is True
    assert first_divergence(differences, FLOAT64.atol).startswith("no divergence past float32 rounding")


# --- 2. a point declared absent -------------------------------------------------------------


def test_a_final_norm_declared_absent_is_probed_at_the_last_layer_and_named():
    """NoFinalNormsUnprobed maps the final norms to None in both maps: the finder compares the
    last encoder layer's output there and names the norm as absent, with the difference that
    NoFinalNorms (its probe on the Identity left in the norm's place) measures."""
    case = first_case(PRE)
    unprobed = locate(f"{FIXTURES}.blocks:NoFinalNormsUnprobed", case)
    line = first_divergence(unprobed, FLOAT64.atol)
    assert line.startswith("first divergence: encoder.norm (absent in NoFinalNormsUnprobed: compared at "
                           "model.encoder.layers.1's output; max |Δ| "), line
    probed = {d.point: d.max_abs for d in locate(f"{FIXTURES}.blocks:NoFinalNorms", case)}
    assert next(d.max_abs for d in unprobed if d.point == "encoder.norm") == probed["encoder.norm"] > 1


# --- 3. gradients -------------------------------------------------------------------------------


def test_a_padding_idx_row_is_named():
    batch = random_batch(POST, seed=0)
    assert (batch.tgt == 1).any()  # id 1 is a real token here, so the reference trains its row
    result = gradients(f"{FIXTURES}.residual:PadAtOne", REFERENCE, POST, 0)
    assert result.passed is False
    assert "row 1 of tgt_embed.weight's gradient is zero where the reference's is not: an embedding built " \
           "with padding_idx?" in result.detail, result.detail


def test_gradients_within_float32_rounding_only_pass_with_the_note():
    """A float32 table: every gradient past 1e-10 lies within the reference's own float32
    rounding of it, and float32 is on the model's path: a pass, as float32 rounding only. (A
    float64 model off by as little fails: tests/variants/check/test_checker_thresholds.py.)"""
    result = gradients(f"{FIXTURES}.sublayers:Float32Table", REFERENCE, PRE.replace(n_layers=1), 0)
    assert result.passed is True and result.precision is True and 1e-10 < result.max_abs < 1e-7
    assert re.match(r"float32 rounding only: \d+ differ within float32 rounding \(src_embed\.weight ",
                    result.detail), result.detail


class DetachedGeneratorBias(tutorial.Transformer):
    """The generator's bias used detached: no gradient reaches it."""

    def project(self, hidden: Tensor) -> Tensor:
        return F.log_softmax(F.linear(hidden, self.generator.weight, self.generator.bias.detach()), dim=-1)


def test_a_weight_no_gradient_reaches_is_named():
    result = gradients(f"{__name__}:DetachedGeneratorBias", REFERENCE, SMALL, 0)
    assert result.passed is False
    assert "no gradient reaches generator.bias" in result.detail, result.detail


# --- 4. the classic mistakes -------------------------------------------------------------------


def test_logits_are_named_from_the_rows_logsumexp():
    result = forward(f"{FIXTURES}.residual:Logits", first_case(SMALL), 0, "forward")
    assert result.passed is False
    assert re.search(r"hint: the rows' logsumexp is up to \S+, not 0: logits, not log-probabilities",
                     result.detail), result.detail


def test_a_minus_inf_fill_is_named_behind_nan():
    case = Case("explicit", SMALL, torch.float64, masked_batch(SMALL, 0), FLOAT64)
    result = forward(f"{FIXTURES}.residual:InfFill", case, 0, "masked")
    assert result.passed is False and math.isnan(result.max_abs)
    assert "masked scores are filled with -inf" in result.detail, result.detail
    assert forward(f"{FIXTURES}.residual:Checked", case, 0, "masked").passed  # the finite fill passes


def test_a_flat_output_fails_the_forward_in_one_line_and_the_training_checks_go_on():
    results = {r.check: r for r in run_battery(f"{FIXTURES}.residual:Flat", config=SMALL, modes=("post",))}
    first = results["forward float64 post-norm S=7 T=5"]
    assert first.passed is False
    assert first.detail == ("shape (15, 19), expected (3, 5, 19); hint: a flat (B·T, V) output: "
                            "return (B, T, V) log-probabilities, e.g. log_probs.view(3, 5, -1) for this "
                            "batch (the gradient and training checks reshape it to go on)")
    assert (results["gradients float64 post-norm"].passed
            and results["3 Adam steps float64 post-norm (losses)"].passed)


def test_masks_a_decoder_reads_swapped_are_found_by_trying_the_swap():
    result = forward(f"{FIXTURES}.tokens:SwappedMasks", first_case(PRE), 0, "forward")
    assert result.passed is False
    assert "hint: with src_mask and tgt_mask exchanged in decode the model runs, and then agrees with the " \
           "reference to " in result.detail, result.detail
    assert "adds an axis of its own" not in result.detail


def test_tied_weights_are_named_and_checked_with_share_embeddings(capsys):
    with pytest.raises(SpecError, match=r"hint: the model ties weights \(decoder_generator\.linear\.weight "
                                        r"is trg_embedding\.embeddings_table\.weight, one tensor\): check a "
                                        r"tied model against the tied reference with --share-embeddings"):
        build(f"{FIXTURES}.tokens:Tied", PRE)
    tied = PRE.replace(n_layers=1, share_embeddings=True, tgt_vocab_size=PRE.src_vocab_size)
    results = run_battery(f"{FIXTURES}.tokens:Tied", config=tied, modes=("pre",))
    assert all(r.passed is not False for r in results), [(r.check, r.detail) for r in results if not r.passed]


# --- 5. dropout sites ------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", residual.MISSING_DROPOUT, ids=lambda cls: cls.__name__)
def test_each_missing_dropout_site_is_named(fixture):
    result = dropout_sites(f"{FIXTURES}.residual:{fixture.__name__}", SMALL, 0)
    assert result.passed is False
    expected = ", ".join(residual.MISSING_DROPOUT[fixture])
    assert result.detail.startswith(f"missing dropout: {expected}"), result.detail


@pytest.mark.parametrize("spec", ["explicit", "torch", f"{FIXTURES}.residual:Checked"])
def test_the_architecture_s_sites_pass(spec):
    assert dropout_sites(spec, SMALL, 0).passed is True


def test_dropout_wired_to_a_constant_shows_at_another_p():
    result = dropout_sites(f"{FIXTURES}.sublayers:UnwiredDropout", PRE.replace(n_layers=1), 0)
    assert result.passed is False
    assert "dropout not at the config's p=0.3: encoder.layers.0.self_attn (attention weights) at p=0.1" \
        in result.detail, result.detail


# --- 6. less to write --------------------------------------------------------------------------


def concrete(table: dict, names) -> dict:
    """A map's entries resolved to concrete names (the strings a pattern's fields fill)."""
    matched, problems = match_patterns(table, names)
    assert not problems, problems
    resolved = {}
    for name, (target, fields) in matched.items():
        if isinstance(target, str):
            target = Param(target)
        resolved[name] = None if target is None else Param(target.name.format(**fields), target.layout,
                                                           target.chunk)
    return resolved


@pytest.mark.parametrize(("cls", "config"), [
    (tutorial.Transformer, POST), (blocks.Checked, PRE), (sublayers.Checked, PRE),
    (variant_class("explicit"), POST), (variant_class("einsum"), POST), (variant_class("fused"), POST),
    (variant_class(REFERENCE), POST)],
    ids=["tutorial", "blocks", "sublayers", "explicit", "einsum", "fused", "torch"])
def test_the_suggested_weight_map_is_the_one_written_by_hand(cls, config):
    found = draft(interfaced(cls)(config), config)
    shapes = canonical_shapes(config)
    assert concrete(weight_patterns(found), shapes) == concrete(cls.weight_map, shapes)


@pytest.mark.parametrize("cls", [tutorial.Transformer, variant_class("explicit"), variant_class("einsum"),
                                 variant_class("fused"), variant_class(REFERENCE)],
                         ids=["tutorial", "explicit", "einsum", "fused", "torch"])
def test_equal_vocabularies_untied_map_each_embedding_to_its_own_table(cls):
    """Source and target vocabularies of one size (23 and 23) but two tables: the draft cannot
    tell them apart by shape, and must still send src_embed and tgt_embed to different
    parameters, each the one the class's hand-written map names."""
    config = POST.replace(tgt_vocab_size=POST.src_vocab_size)
    assert not config.share_embeddings
    found = draft(interfaced(cls)(config), config)
    shapes = canonical_shapes(config)
    drafted, by_hand = concrete(weight_patterns(found), shapes), concrete(cls.weight_map, shapes)
    src, tgt = drafted["src_embed.weight"], drafted["tgt_embed.weight"]
    assert src.name != tgt.name, (src, tgt)
    assert (src, tgt) == (by_hand["src_embed.weight"], by_hand["tgt_embed.weight"])


@pytest.mark.parametrize(("spec", "config", "point"), [
    (f"{FIXTURES}.bugs:Source1LayerNorm", POST, "encoder.layers.0.norm1"),
    (f"{FIXTURES}.bugs:SwappedCrossKeysValues", POST, "decoder.layers.1.cross_attn"),
    (f"{FIXTURES}.residual:EmbeddingNorm", POST, "src_embed"),
], ids=["Source1LayerNorm", "SwappedCrossKeysValues", "EmbeddingNorm"])
def test_inferred_probes_find_the_same_first_divergence(spec, config, point):
    """The bugs' classes with their probe maps replaced by the inferred ones (the attention
    probed at W_o, the embeddings at the first layer's input) name the same point."""
    module, _, name = spec.rpartition(":")
    cls = getattr(__import__(module, fromlist=[name]), name)
    found = draft(interfaced(cls)(config), config)
    globals()[f"Inferred{name}"] = type(f"Inferred{name}", (cls,), {
        "__module__": __name__, "probe_map": {p: probe for p, probe in found.probes.items()}})
    line = first_divergence(locate(f"{__name__}:Inferred{name}", first_case(config)), FLOAT64.atol)
    assert line.startswith(f"first divergence: {point} ("), line


def test_suggest_maps_prints_python_that_builds(capsys):
    assert main([f"{FIXTURES}.tutorial:Transformer", "--suggest-maps", "--norm", "post"]) == 0
    text = capsys.readouterr().out
    namespace: dict = {"Probe": Probe}
    exec(text, namespace)
    pasted = type("Pasted", (tutorial.Transformer,), {"__module__": __name__,
                                                     "weight_map": namespace["weight_map"],
                                                     "probe_map": namespace["probe_map"]})
    globals()["Pasted"] = pasted
    assert len(namespace["weight_map"]) <= 21 and len(namespace["probe_map"]) <= 12
    assert forward(f"{__name__}:Pasted", first_case(POST), 0, "forward").passed


def test_a_class_without_maps_gets_them_inferred_and_said_so(capsys):
    assert main([f"{FIXTURES}.tokens:NoProject", "--layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "protocol: forward only (it defines encode and decode but no project): every check calls " \
           "forward(src, tgt, src_mask, tgt_mask)\n" in out
    assert "maps: inferred from NoProject's modules (--suggest-maps prints them to read or paste)\n" in out


def test_what_the_draft_cannot_place_is_marked():
    found = draft(interfaced(residual.HardWiredWidth)(SMALL), SMALL)
    text = as_python(found, SMALL, "HardWiredWidth")
    assert "# note: the feed-forward is 2048 wide (encoder.layer_stack.0), the config's d_ff 128: " \
           "pass --d-ff 2048" in text
    assert "# TODO: not placed: encoder.layers.0.ff.w1.weight" in text
    assert not any(point.endswith(".ff") for point in probe_patterns(found))  # not guessed either


def test_a_hard_wired_width_points_at_d_ff(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([f"{FIXTURES}.residual:HardWiredWidth", "--layers", "1"])
    assert exit_info.value.code == 2
    assert "pass --d-ff 2048" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "role"), [
    ("trg_token_ids_batch", "tgt"), ("src_token_ids_batch", "src"), ("src_representations_batch", "memory"),
    ("e_outputs", "memory"), ("trg_mask", "tgt_mask"), ("dec_enc_attn_mask", "src_mask"), ("src_seq", "src"),
    ("trg_seq", "tgt"), ("enc", None), ("x", None)])
def test_argument_spellings_are_read(name, role):
    assert role_of(name) == role


def test_a_decode_with_tutorial_names_in_another_order_is_refused():
    with pytest.raises(SpecError, match=re.escape(
            "TutorialDecodeOrder.decode takes (trg_token_ids_batch, src_representations_batch, trg_mask, "
            "src_mask), but the suite calls decode(tgt, memory, src_mask, tgt_mask)")):
        build(f"{FIXTURES}.tokens:TutorialDecodeOrder", PRE)


class ForwardOnlyReordered(nn.Module):
    """A forward-only class whose forward takes the target first."""

    weight_map: ClassVar[dict] = tutorial.Transformer.weight_map

    def __init__(self, config) -> None:
        super().__init__()
        self.inner = tutorial.Transformer(config)

    def forward(self, trg_seq, src_seq, src_mask, trg_mask):
        return src_seq


def test_a_forward_only_class_is_checked_for_order_too():
    with pytest.raises(SpecError, match=r"forward takes \(trg_seq, src_seq, src_mask, trg_mask\)"):
        build(f"{__name__}:ForwardOnlyReordered", SMALL)


class BlocksWithoutMaps(blocks.Checked):
    """blocks' adapter with its two maps taken out (None asks for them to be inferred)."""

    weight_map = probe_map = None


class SublayersWithoutMaps(sublayers.Checked):
    weight_map = probe_map = None


@pytest.mark.parametrize("name", ["BlocksWithoutMaps", "SublayersWithoutMaps"])
def test_a_hand_written_adapter_passes_with_its_maps_left_out(name):
    results = run_battery(f"{__name__}:{name}", config=SMALL, modes=("pre",))
    assert all(r.passed is not False for r in results), [(r.check, r.detail) for r in results if not r.passed]
    assert build(f"{__name__}:{name}", PRE).inferred_maps is True
