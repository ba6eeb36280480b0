"""``python -m variants.check`` on a model in the shape maintained libraries give theirs
(``tests/fixtures/outside/library.py``): the draft places norms by the order the layer calls them,
reads NaN memory, and is run before it is printed (verified, corrected by an exchange of
same-shaped parameters, or unverified); a wrong map, two departures together, a difference at
padded positions only, a model in the other norm mode and float32 casts are each named for what
they are, the report opening with the cause; a trained extra parameter is named when the Adam
steps part."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from common.probes import Probe
from common.random_batch import random_batch
from tests.fixtures.outside import library
from variants import REFERENCE
from variants.check.__main__ import leading_cause, main
from variants.check.adapter import drafting
from variants.check.battery import forward, gradients, lockstep, masked_batch
from variants.check.combined import exchanged
from variants.check.diagnose import MASK_HINT, explain_first, locate, padded_point, trained_extras
from variants.check.harness import CONFIG, Case, Result
from variants.check.patterns import as_python
from variants.check.suggest import draft
from variants.check.tolerances import FLOAT64
from variants.check.verify import verified

LIBRARY = "tests.fixtures.outside.library"
SMALL = CONFIG.replace(n_layers=1, d_ff=64)  # one layer per stack: the component tests' model
PRE = SMALL.replace(norm_first=True)


def case(config=PRE, inputs=None) -> Case:
    return Case(REFERENCE, config, torch.float64, inputs or random_batch(config, 3, 7, 5).inputs(), FLOAT64)


def why(name: str, config=PRE) -> str:
    spec, first = f"{LIBRARY}:{name}", case(config)
    return explain_first(spec, first, 0, locate(spec, first))


def line_of(text: str) -> int:
    lines = Path(library.__file__).read_text(encoding="utf-8").splitlines()
    (number,) = [n for n, line in enumerate(lines, 1) if text in line]
    return number


# --- the draft ----------------------------------------------------------------------------------


def test_the_draft_places_norms_in_the_order_the_layer_calls_them():
    """Each layer registers its feed-forward (which holds a norm) before its own norms, and calls
    that norm last: norm1 is the layer's own norm, as the hand-written map says."""
    found = draft(drafting(library.Checked)(PRE), PRE)
    for stack, norms in (("encoder", ("layer_norm", "feed_forward.layer_norm")),
                         ("decoder", ("layer_norm_1", "layer_norm_2", "feed_forward.layer_norm"))):
        for n, module in enumerate(norms, start=1):
            target = f"{stack}.transformer.0.{module}"
            assert found.weights[f"{stack}.layers.0.norm{n}.weight"] == f"{target}.weight"
            assert found.probes[f"{stack}.layers.0.norm{n}"] == Probe(f"{stack}.transformer.0.{module}")
    assert any("placed in call order" in note and "not their registration order" in note
               for note in found.notes), found.notes


def test_a_draft_over_uninitialised_parameters_keeps_its_embedding_points():
    """NaN memory (a library's skip_init) in every parameter: the draft still finds the module
    whose output is each stack's first input."""
    found = draft(drafting(library.Uninitialised)(PRE), PRE)
    assert found.probes["src_embed"] == Probe("encoder.dropout")
    assert found.probes["tgt_embed"] == Probe("decoder.dropout")


class EmbeddingsInForward(library.Checked):
    """The embeddings summed in forward, through no module of their own."""

    def embed(self, stack, ids):
        return stack.embeddings(ids) * self.config.d_model ** 0.5 + self.pe[: ids.shape[1]].to(torch.float32)


def test_a_point_the_draft_cannot_place_is_flagged_not_left_out_silently():
    found = draft(drafting(EmbeddingsInForward)(PRE), PRE)
    assert found.probes["src_embed"] is None
    assert any(note.startswith("src_embed: no module's output is the encoder's first input")
               for note in found.notes), found.notes


# --- the draft, run against the reference ------------------------------------------------------------


def suggested(name: str, capsys) -> tuple[list[str], str, dict]:
    """What --suggest-maps prints for the fixture ``name`` (one layer): its lines, its text, and
    the maps it defines when run as Python."""
    assert main([f"{LIBRARY}:{name}", "--suggest-maps", "--layers", "1"]) == 0
    text = capsys.readouterr().out
    namespace: dict = {"Probe": Probe}
    exec(text, namespace)
    return text.splitlines(), text, namespace


class PastedListed(library.ListedKeysFirst):
    """ListedKeysFirst with the maps --suggest-maps printed for it (set by the test below)."""


def test_a_draft_that_reads_two_same_shaped_linears_wrong_is_corrected_by_running_it(capsys):
    """Names, registration order and call order all read proj.0 as W_q; it is the keys' linear.
    Run, the draft diverges at the first attention; with W_q and W_k exchanged it agrees, and the
    map printed is the corrected one, its entries marked."""
    read = draft(drafting(library.ListedKeysFirst)(PRE), PRE)  # what reading alone gives
    assert read.weights["encoder.layers.0.self_attn.wq.weight"] == \
        "encoder.transformer.0.self_attn.proj.0.weight"
    lines, text, maps = suggested("ListedKeysFirst", capsys)
    assert lines[1].startswith("# corrected: as drafted, the forward diverged at encoder.layers.0.self_attn "
                               "(max |Δ| "), lines[1]
    assert "; with W_q and W_k (the queries' and the keys' linear) exchanged in " \
           "encoder.layers.0.self_attn, decoder.layers.0.self_attn, decoder.layers.0.cross_attn, it agrees " \
           "with the reference at every point: the entries marked below are corrected" in lines[1], lines[1]
    weights = maps["weight_map"]
    for stack, attn in (("{stack}", "self_attn"), ("decoder", "cross_attn")):
        for proj, index in (("wq", 1), ("wk", 0), ("wv", 2), ("wo", 3)):  # the fixture's list: keys first
            assert weights[f"{stack}.layers.{{i}}.{attn}.{proj}.{{kind}}"] == \
                f"{stack}.transformer.{{i}}.{attn}.proj.{index}.{{kind}}"
    assert "'{stack}.transformer.{i}.self_attn.proj.1.{kind}',  # corrected: exchanged with wk\n" in text
    assert "proj.2.{kind}',  #" not in text  # W_v was not exchanged, and is not marked
    PastedListed.weight_map, PastedListed.probe_map = weights, maps["probe_map"]
    assert forward(f"{__name__}:PastedListed", case(), 0, "forward").passed


def test_a_draft_that_is_right_is_verified(capsys):
    lines, text, _ = suggested("Checked", capsys)
    assert lines[1].startswith("# verified: the reference's seeded weights, loaded through this map, give "
                               "the reference's values at every point in float64 (largest |Δ| "), lines[1]
    assert "corrected" not in text


def test_a_draft_of_a_model_that_departs_is_unverified(capsys):
    """ScaledSinusoids departs at the embeddings: no exchange helps, and the draft says where."""
    lines, _, _ = suggested("ScaledSinusoids", capsys)
    assert lines[1].startswith("# unverified: the draft diverges at src_embed (max |Δ| "), lines[1]
    assert "no exchange of same-shaped parameters there (another norm's module, W_q/W_k, a decoder layer's " \
           "self-/cross-attention) makes it agree" in lines[1], lines[1]


@pytest.mark.parametrize(("slot", "other", "says", "mark"), [
    ("encoder.layers.0.norm1", "encoder.layers.0.norm2",
     "with the two norms' modules exchanged in encoder.layers.0.norm1 and encoder.layers.0.norm2, it agrees",
     "'encoder.layers.{i}.norm1.{kind}': 'encoder.transformer.{i}.layer_norm.{kind}',  # corrected: "
     "exchanged with norm2"),
    ("decoder.layers.0.self_attn", "decoder.layers.0.cross_attn",
     "with the self-attention and the cross-attention exchanged in decoder.layers.0, it agrees",
     "'decoder.layers.{i}.cross_attn': 'decoder.transformer.{i}.cross_attn.final_linear',  # corrected: "
     "exchanged with self_attn"),
], ids=["norms", "self/cross"])
def test_a_draft_with_two_slots_exchanged_is_corrected(slot, other, says, mark):
    """The right draft with two slots' weights and probes exchanged, as a misreading would: run,
    the exchange is found and undone."""
    right = draft(drafting(library.Checked)(PRE), PRE)
    wrong = replace(right, weights=exchanged(right.weights, slot, other),
                    probes=exchanged(right.probes, slot, other))
    assert wrong.weights != right.weights and wrong.probes != right.probes
    found = verified(library.Checked, wrong, PRE)
    assert found.verdict.startswith("corrected: as drafted, the forward diverged at "), found.verdict
    assert says in found.verdict, found.verdict
    assert found.weights == right.weights and found.probes == right.probes
    assert mark in as_python(found, PRE, "Checked")


def test_norms_drafted_in_registration_order_are_put_back_in_call_order():
    """Every layer's norms in registration order, the feed-forward's first (a decoder layer's
    three in a cycle no single exchange undoes): run, the draft is put back, exchange by exchange."""
    right = draft(drafting(library.Checked)(PRE), PRE)
    wrong = right
    for slot, other in (("encoder.layers.0.norm1", "encoder.layers.0.norm2"),
                        ("decoder.layers.0.norm1", "decoder.layers.0.norm3"),
                        ("decoder.layers.0.norm2", "decoder.layers.0.norm3")):
        wrong = replace(wrong, weights=exchanged(wrong.weights, slot, other),
                        probes=exchanged(wrong.probes, slot, other))
    assert wrong.weights["decoder.layers.0.norm1.weight"] == \
        "decoder.transformer.0.feed_forward.layer_norm.weight"
    assert wrong.weights["decoder.layers.0.norm2.weight"] == "decoder.transformer.0.layer_norm_1.weight"
    found = verified(library.Checked, wrong, PRE)
    assert found.verdict.startswith("corrected: "), found.verdict
    assert found.weights == right.weights and found.probes == right.probes


# --- wrong maps, two departures, the closest fit, the departures under another config ------------


@pytest.mark.parametrize(("name", "config", "says"), [
    ("SwappedNorms", PRE, "explained: encoder.layers.0.norm1 holds encoder.layers.0.norm2's gain and "
                          "shift: a weight map that sends encoder.layers.0.norm1 to encoder.layers.0.norm2's "
                          "module"),
    ("SwappedQueryKey", PRE, "explained: W_q and W_k exchanged"),
    ("ReversedHeads", PRE, "explained: the heads of W_q, W_k and W_v in reverse order against W_o's columns"),
    ("ScaledSinusoids", PRE, "explained: two departures together at the embeddings: the embeddings not "
                             "scaled by √d_model = √32; and the positions scaled by 1/√d_model = 0.177 (the "
                             "value the model's own pos_scale holds) (together the reference's embeddings "
                             "times 0.177)"),
    ("FairseqPositions", PRE, "explained: the positions counted from 2 (fairseq's padding_idx + 1), not 0;"),
    ("SiluNoBias", PRE.replace(activation="silu"), "explained: the first linear's bias left out;"),
], ids=["norms swapped", "W_q/W_k swapped", "heads reversed", "two at the embeddings", "fairseq offset",
        "silu"])
def test_the_departure_is_named(name, config, says):
    assert why(name, config).startswith(says), why(name, config)


def test_a_wrong_map_is_named_with_the_map_that_fits():
    """The explanation names the model's own parameters each slot should take."""
    assert "; the map that fits sends encoder.layers.0.norm1.weight to " \
        "'encoder.transformer.0.layer_norm.weight' and encoder.layers.0.norm2.weight to " \
        "'encoder.transformer.0.feed_forward.layer_norm.weight'" \
        in why("SwappedNorms")
    assert "; the map that fits sends encoder.layers.0.self_attn.wq.weight to " \
        "'encoder.transformer.0.self_attn.linear_query.weight'" in why("SwappedQueryKey")


def test_of_several_fitting_departures_the_closest_is_named():
    """eps 0 in float64: eps 1e-12, tried before it, fits within the tolerance too; the closest,
    the model's own, is named."""
    line = why("EpsZero")
    assert line.startswith("explained: LayerNorm eps 0 where the reference's is 1e-06;"), line


def test_two_departures_in_one_layernorm_are_named_together():
    """A norm with eps 1e-5 and no shift: no single departure fits, the pair does."""
    assert why("EpsNoShift").startswith(
        "explained: two departures together in the LayerNorm: eps 1e-05 (nn.LayerNorm's default) where the "
        "reference's is 1e-06, and no shift (bias);"), why("EpsNoShift")


# --- padded positions, the other norm mode ---------------------------------------------------------


def test_an_output_that_differs_only_at_padded_targets_says_so_and_no_loss_sees_it():
    spec = f"{LIBRARY}:PaddedZeros"
    first = case()
    result = forward(spec, first, 0, "forward")
    padded = int((first.inputs[1] == PRE.pad_id).sum())
    assert padded > 0 and result.passed is False
    assert re.search(rf"hint: only the {padded} padded target positions \(tgt == pad_id 0\) differ; at every "
                     r"real position the output agrees to \S+: .* which no loss over real targets sees",
                     result.detail), result.detail
    assert gradients(spec, REFERENCE, PRE, 0).passed  # the loss indeed does not see them
    note = padded_point(spec, first, 0, "encoder.layers.0.norm2")
    assert note.startswith("encoder.layers.0.norm2 differs only at padded source positions"), note


def test_a_fully_masked_row_that_alone_differs_says_so():
    spec = f"{LIBRARY}:MaskedRowZeros"
    masked = Case("explicit", PRE, torch.float64, masked_batch(PRE, 0), FLOAT64)
    result = forward(spec, masked, 0, "fully masked source row")
    assert result.passed is False
    assert "hint: only batch row 1, whose source is padding only, differs" in result.detail, result.detail
    assert forward(spec, case(), 0, "forward").passed  # nothing else differs


def test_a_model_built_for_post_norm_that_computes_pre_norm_is_told_to_declare_it():
    result = forward(f"{LIBRARY}:Undeclared", case(SMALL), 0, "forward")
    assert result.passed is False
    assert result.detail.endswith('it passes as pre-norm; declare norm_modes = ("pre",) on the class'), \
        result.detail
    assert "declare norm_modes" not in forward(f"{LIBRARY}:SwappedNorms", case(), 0, "forward").detail


# --- float32, trained extra parameters ---------------------------------------------------------------


def test_a_model_whose_only_departures_are_float32_casts_passes_with_each_source_named():
    spec = f"{LIBRARY}:Float32"
    result = forward(spec, case(), 0, "forward")
    assert result.passed and result.precision, result.detail
    assert f"Float32's buffer pe holds float32 values (a table computed in float32, then cast up), at " \
           f"tests/fixtures/outside/library.py:{line_of('positions = self.pe[: ids.shape[1]]')} in embed" \
        in result.detail, result.detail
    assert "Float32's attention softmax runs in float32 (a cast before it), at tests/fixtures/outside/" \
           f"library.py:{line_of('low = scores.float()')} in softmax" in result.detail, result.detail
    steps = lockstep(spec, REFERENCE, PRE, 0)
    assert steps.passed and steps.precision and steps.max_abs > FLOAT64.atol, steps
    assert "attention softmax runs in float32" in steps.detail


def test_a_trained_extra_parameter_is_named_when_the_adam_steps_part():
    spec = f"{LIBRARY}:TrainedScale"
    assert forward(spec, case(), 0, "forward").passed
    assert gradients(spec, REFERENCE, PRE, 0).passed
    assert lockstep(spec, REFERENCE, PRE, 0).passed is False
    extras, sources = trained_extras(spec, PRE)
    assert [extra.partition(" ")[0] for extra in extras] == ["pos_scale"] and sources == []
    assert trained_extras(f"{LIBRARY}:Mapped", PRE) == ([], [])


# --- the line the report opens with ---------------------------------------------------------------


def test_the_report_opens_with_the_cause_both_departures_named(capsys):
    assert main([f"{LIBRARY}:ScaledSinusoids", "--layers", "1", "--norm", "pre"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("cause (src_embed): two departures together at the embeddings: "), first
    assert "the embeddings not scaled by √d_model = √32" in first, first
    assert "the positions scaled by 1/√d_model = 0.177" in first, first


def test_the_report_opens_with_the_surest_cause_found():
    """A fitted explanation, then a failed check's hint (a hint to check the masks last), then a
    difference at padded positions only, then trained extra parameters; a passed check's detail
    is no cause."""
    hinted = Result("forward float64", False, detail="max |Δ| 2; hint: the masks exchanged in decode")
    masks = Result("bad inputs", False, detail=f"RuntimeError: shapes; hint: {MASK_HINT}")
    found = {"explained": "cause (src_embed): A", "padded": "cause: B", "trained": "cause: C"}
    assert leading_cause([masks, hinted], found) == "cause (src_embed): A"
    assert leading_cause([masks, hinted], {**found, "explained": ""}) == \
        "cause (forward float64): the masks exchanged in decode"
    assert leading_cause([masks], {}) == f"cause (bad inputs): {MASK_HINT}"
    assert leading_cause([Result("padded", False, detail="hint: only padded")], {}) == \
        "cause (padded): only padded"
    assert leading_cause([Result("x", True, detail="hint: y")], {**found, "explained": ""}) == "cause: B"
    assert leading_cause([], {"trained": "cause: C"}) == "cause: C"
    assert leading_cause([], {}) == ""


# --- end to end: the first thing printed after the table ------------------------------------------


FIRST_SAID = {  # fixture -> the start of the first line the checker prints after its table
    "ScaledSinusoids": "explained: two departures together at the embeddings",
    "SwappedNorms": "explained: encoder.layers.0.norm1 holds encoder.layers.0.norm2's gain and shift",
    "PaddedZeros": "  forward float64 pre-norm S=7 T=5: hint: only the 3 padded target positions",
    "MaskedRowZeros": "  fully masked source row pre-norm vs explicit: hint: only batch row 1, whose source",
    "Undeclared": "  forward float64 post-norm S=7 T=5: hint: built for post-norm, the model agrees with the "
                  "reference in pre-norm",
    "TrainedScale": "  the model trains parameters the reference does not have (extra_parameters): pos_scale",
    "ListedKeysFirst": "explained: W_q and W_k exchanged",
}
LEAD = {  # fixture -> the start of the first line the checker prints
    "ScaledSinusoids": "cause (src_embed): two departures together at the embeddings",
    "SwappedNorms": "cause (encoder.layers.0.norm1): encoder.layers.0.norm1 holds encoder.layers.0.norm2's",
    "PaddedZeros": "cause (forward float64 pre-norm S=7 T=5): only the 3 padded target positions",
    "MaskedRowZeros": "cause (fully masked source row pre-norm vs explicit): only batch row 1, whose source",
    "Undeclared": "cause (forward float64 post-norm S=7 T=5): built for post-norm, the model agrees with the "
                  "reference in pre-norm",
    "TrainedScale": "cause: the model trains parameters the reference does not have (extra_parameters): "
                    "pos_scale",
    "ListedKeysFirst": "cause (encoder.layers.0.self_attn): W_q and W_k exchanged",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", FIRST_SAID)
def test_the_first_thing_printed_names_the_true_cause(name, capsys):
    assert main([f"{LIBRARY}:{name}", "--layers", "1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    table_end = max(k for k, line in enumerate(lines) if line.startswith(("bad inputs", "post-norm: every")))
    said = [line for line in lines[table_end + 1:] if line.strip() and not line.startswith(
        ("  post-norm: every check", "  gradients", "where ", "point ", "---", "why ", "first divergence"))
        and not re.match(r"(src|tgt)_embed |encoder\.|decoder\.|generator ", line)]
    assert said[0].startswith(FIRST_SAID[name]), said[:3]
    assert lines[0].startswith(LEAD[name]), lines[0]


@pytest.mark.slow
def test_the_float32_model_passes_every_check_end_to_end(capsys):
    assert main([f"{LIBRARY}:Float32", "--layers", "1"]) == 0
    assert re.search(r"every check passes; \d+ of them within float32 rounding only", capsys.readouterr().out)
