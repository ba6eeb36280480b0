"""``python -m variants.check`` on the blog-style model (tests/fixtures/outside/blog.py: per-head
``Linear(D, D/H)`` layers, its own names, post-norm, a float32 sinusoid table, the paper's
dropout) and on a tutorial whose layers return tuples (tuples.py): per-head weight maps and
``stack_names``, the drafted maps, a correct model passing with a float32 note, its planted bugs
named and explained, dropout sites against a named reference, masks broadcast silently, and a
declared-absent final norm read from the last layer."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.positions import sinusoid_table
from common.probes import Probe, capture
from common.random_batch import random_batch
from common.weights import export_weights, import_weights
from tests.fixtures.outside import blog, tuples, tutorial
from variants import REFERENCE, SpecError, build
from variants.check import departures
from variants.check.__main__ import main
from variants.check.adapter import drafting
from variants.check.battery import dropout_sites, forward, run_battery
from variants.check.diagnose import explain_first, locate, stand_ins
from variants.check.divergence import capture_watched, first_divergence
from variants.check.harness import CONFIG, Case, battery_weights
from variants.check.patterns import as_python
from variants.check.sites import expected_sites, place
from variants.check.suggest import draft
from variants.check.tolerances import FLOAT64

FIXTURES = "tests.fixtures.outside"
BLOG = f"{FIXTURES}.blog"
POST = CONFIG  # post-norm, 2 layers, 4 heads, d_model 32


def first_case(config=POST) -> Case:
    return Case(REFERENCE, config, torch.float64, random_batch(config, 3, 7, 5).inputs(), FLOAT64)


def run(argv: list[str], capsys) -> tuple[int, list[str]]:
    code = main(argv)
    return code, capsys.readouterr().out.rstrip().splitlines()


# --- per-head layers and the model's own names --------------------------------------------------


def test_a_projection_sent_to_heads_is_their_rows_in_head_order():
    """blog.Mapped's map sends W_q to each head's ``query`` (``{h}``): after importing canonical
    weights, head h's query weight, as the head runs, is rows h·D/H to (h + 1)·D/H of W_q."""
    model = build(f"{BLOG}:Mapped", POST)
    state = battery_weights(POST, 0)
    import_weights(model, state)
    with torch.no_grad():
        model(*random_batch(POST).inputs())
    size = POST.d_model // POST.n_heads
    for h, head in enumerate(model.dec_blocks[1].ca.heads):
        rows = slice(h * size, (h + 1) * size)
        assert torch.equal(head.query.weight, state["decoder.layers.1.cross_attn.wq.weight"][rows])
        assert torch.equal(head.value.bias, state["decoder.layers.1.cross_attn.wv.bias"][rows])
    assert torch.equal(export_weights(model)["encoder.layers.0.self_attn.wk.weight"],
                       state["encoder.layers.0.self_attn.wk.weight"])


def test_gradients_reach_the_per_head_rows():
    model = build(f"{BLOG}:Mapped", POST).double().train()
    batch = random_batch(POST)
    F.nll_loss(model(*batch.inputs()).flatten(0, 1), batch.labels.flatten(), ignore_index=0).backward()
    grads = {name: param.grad for name, param in model.named_parameters()}
    assert grads["per_head_rows.encoder_layers_0_self_attn_wq_weight"].abs().sum() > 0
    assert not any(name.startswith("enc_blocks.0.sa.heads.") and name.endswith("weight") for name in grads)


class MisspeltHeads(blog.Checked):
    stack_names: ClassVar[dict] = blog.Mapped.stack_names
    weight_map: ClassVar[dict] = {**blog.Mapped.weight_map,
                                  "{stack}.layers.{i}.self_attn.wq.{kind}":
                                      "{stack}_blocks.{i}.sa.heads.{h}.q.{kind}"}
    probe_map: ClassVar[dict] = blog.Mapped.probe_map


class BadStackNames(blog.Mapped):
    stack_names: ClassVar[dict] = {"enc": "enc"}


@pytest.mark.parametrize(("name", "says"), [
    ("MisspeltHeads", "MisspeltHeads.weight_map sends encoder.layers.0.self_attn.wq.weight to "
                      "enc_blocks.0.sa.heads.0.q.weight, which the model lacks (and "),
    ("BadStackNames", "stack_names must map 'encoder' and/or 'decoder' to the model's own names for them, "
                      "got {'enc': 'enc'}"),
])
def test_a_per_head_target_or_stack_names_that_do_not_fit_are_one_line(name, says):
    with pytest.raises(SpecError) as error:
        build(f"{__name__}:{name}", POST)
    assert says in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_the_drafted_maps_use_heads_and_the_models_own_stack_names(capsys):
    """``--suggest-maps`` on the blog model (no self.config, a constructor of its own adapted,
    per-head lists, enc_/dec_ names, final norms hung on the model) prints maps that are the ones
    pasted into blog.Mapped, and nothing is left unplaced."""
    assert main([f"{BLOG}:Checked", "--suggest-maps", "--norm", "post"]) == 0
    text = capsys.readouterr().out
    assert "# note" not in text and "TODO" not in text and "not placed" not in text, text
    namespace: dict = {"Probe": Probe}
    exec(text, namespace)
    assert namespace["stack_names"] == blog.Mapped.stack_names == {"encoder": "enc", "decoder": "dec"}
    assert namespace["weight_map"] == blog.Mapped.weight_map
    assert namespace["probe_map"] == {point: Probe(target) if isinstance(target, str) and point == "tgt_embed"
                                      else target for point, target in blog.Mapped.probe_map.items()}


def test_the_blog_adapter_is_at_most_25_lines():
    """What a learner writes to check the blog model: the constructor from the config, the masks
    as it takes them, log-probabilities, its norm mode; the maps are inferred (and
    ``--suggest-maps`` prints them)."""
    source = inspect.getsource(blog.Checked)
    assert sum(1 for line in source.splitlines() if line.strip()) <= 25
    assert "weight_map" not in source and "probe_map" not in source
    assert build(f"{BLOG}:Checked", POST).inferred_maps is True


# --- a correct model passes; its planted bugs are named and explained ---------------------------


def test_the_blog_model_passes_with_the_papers_dropout_sites_and_a_float32_note(capsys):
    code, lines = run([f"{BLOG}:Checked", "--norm", "post", "--dropout-sites", "paper"], capsys)
    assert code == 0, "\n".join(lines)
    rows = [line for line in lines if line.startswith(("forward float64", "gradients", "fully masked"))]
    assert rows and all(" pass (f32) " in row for row in rows), rows
    note = next(line for line in lines if "float32 rounding only: src_embed differs by" in line)
    assert "Checked's buffer pe holds float32 values (a table computed in float32, then cast up), at " \
           "tests/fixtures/outside/blog.py:" in note, note
    assert lines[-1] == ("every check passes; 4 of them within float32 rounding only, which the model "
                         "carries (the note above)")
    assert not any("no divergence past float32 rounding" in line for line in lines)


def test_the_papers_sites_against_torchs_fail_and_point_at_the_option():
    result = dropout_sites(f"{BLOG}:Checked", POST, 0)
    assert result.passed is False and result.tolerance == "torch.nn.Transformer's sites"
    assert result.detail.startswith("missing dropout: encoder.layers.0.self_attn (attention weights), "
                                    "encoder.layers.0.ff (hidden layer)"), result.detail
    assert result.detail.endswith("hint: these are the paper's sites (section 5.4) exactly: check against "
                                  "them with --dropout-sites paper")
    paper = dropout_sites(f"{BLOG}:Checked", POST, 0, "paper")
    assert paper.passed is True and paper.tolerance == "the paper's sites (section 5.4)"


def test_per_head_attention_dropout_is_one_site_per_attention():
    """TorchSites drops each head's (B, T_query, T_key) weights: 4 heads x 6 attentions, counted as
    6 attention-weight sites, which torch.nn.Transformer's sites expect."""
    result = dropout_sites(f"{BLOG}:TorchSites", POST, 0)
    assert result.passed is True, result.detail
    against_paper = dropout_sites(f"{BLOG}:TorchSites", POST, 0, "paper")
    assert against_paper.passed is False
    assert "dropout where the paper's sites have none: encoder.layers.0.self_attn (attention weights)" \
        in against_paper.detail


def test_heads_short_of_a_full_set_are_named_not_counted():
    config = POST.replace(n_layers=1)
    one_head = ("drop", ((3, 5, 5), 0.3, False))
    events = [one_head] * config.n_heads + [("done", "decoder.layers.0.self_attn")]
    assert place(events, config, (3, 7, 5)) == [("decoder.layers.0.self_attn", "attention weights", 0.3)]
    assert place(events[1:], config, (3, 7, 5)) == [
        ("decoder.layers.0.self_attn", "attention weights of 3 of 4 heads", 0.3)]


def test_the_papers_sites_are_embeddings_and_sublayer_outputs_only():
    config = POST.replace(n_layers=1)
    assert expected_sites(config, "paper") == [
        ("src_embed", "embeddings"), ("encoder.layers.0.self_attn", "output, before the residual"),
        ("encoder.layers.0.ff", "output, before the residual"), ("tgt_embed", "embeddings"),
        ("decoder.layers.0.self_attn", "output, before the residual"),
        ("decoder.layers.0.cross_attn", "output, before the residual"),
        ("decoder.layers.0.ff", "output, before the residual")]
    assert len(expected_sites(config, "torch")) == 2 + 3 * 2 + 2 * 2  # weights and hidden layers too


@pytest.mark.parametrize(("spec", "point", "explanation"), [
    (f"{BLOG}:BothBugs", "encoder.layers.0.self_attn",
     "explained: the scores are divided by √d_model = √32 where the reference divides by √d_k = √8: a factor "
     "√H = √(d_model/d_k) = 2 smaller; recomputed so, encoder.layers.0.self_attn matches the model to "),
    (f"{BLOG}:LayerNormEps", "encoder.layers.0.norm1",
     "explained: LayerNorm eps 1e-05 (nn.LayerNorm's default) where the reference's is 1e-06; recomputed so, "
     "encoder.layers.0.norm1 matches the model to "),
], ids=["sqrt d_model", "eps 1e-5"])
def test_each_planted_bug_is_named_and_explained_in_the_last_lines(spec, point, explanation, capsys):
    code, lines = run([spec, "--norm", "post", "--dropout-sites", "paper"], capsys)
    assert code == 1
    assert lines[-2].startswith(f"first divergence: {point} (max |Δ| "), lines[-2]
    assert lines[-2].endswith("(float32 rounding)")  # the table's rounding before it, not the bug
    assert lines[-1].startswith(explanation), lines[-1]
    fit = float(re.search(r"matches the model to (\S+) ", lines[-1])[1])
    assert fit < 1e-12  # recomputed from the model's own inputs: float64 rounding only


def test_a_mask_broadcast_by_per_head_scores_is_named_where_it_happens():
    result = forward(f"{BLOG}:Broadcasting", first_case(), 0, "forward")
    line = next(n for n, text in enumerate(inspect.getsource(blog).splitlines(), 1)
                if "wei = wei.masked_fill(mask == 0" in text)
    assert result.passed is False
    assert result.detail == (
        f"shape (3, 3, 5, 19), expected (3, 5, 19); hint: the output is (3, 3, 5, 19) where the reference's "
        f"is (3, 5, 19): masked_fill at tests/fixtures/outside/blog.py:{line} in forward broadcast a "
        f"(3, 7, 7) tensor against a (3, 1, 1, 7) mask to (3, 3, 7, 7), and nothing raised; the model's "
        f"masks have another layout: the suite passes src_mask (B, 1, 1, S) and tgt_mask (B, 1, T, T): "
        f"scores of one head, (B, T_query, T_key), take src_mask[:, 0] and tgt_mask[:, 0]")


def test_the_draft_says_when_the_forward_pass_broadcast_a_mask():
    text = as_python(draft(drafting(blog.Broadcasting)(POST), POST), POST, "Broadcasting")
    assert "# note: the forward pass returned (2, 2, 4, 19), not (B, T, V) = (2, 4, 19): the extra axis " \
           "is a mask broadcast against tensors of another rank" in text, text


# --- the explanations, each against a model that carries exactly that departure ----------------


class GeluFeedForward(tutorial.Transformer):
    class FeedForward(tutorial.FeedForward):
        def forward(self, x: Tensor) -> Tensor:
            return self.w_2(self.dropout(F.gelu(self.w_1(x))))

    def __init__(self, config) -> None:
        super().__init__(config)
        for module in self.modules():
            if type(module) is tutorial.FeedForward:
                module.__class__ = self.FeedForward


class OutputBiasUnused(tutorial.Transformer):
    class Attention(tutorial.Attention):
        def forward(self, query, key, value, mask):
            out = super().forward(query, key, value, mask)
            return out - self.linears[3].bias  # W_o applied without its bias

    def __init__(self, config) -> None:
        super().__init__(config)
        self.decoder.layers[0].src_attn.__class__ = self.Attention


class NoCausalMask(tutorial.Transformer):
    def decode(self, tgt, memory, src_mask, tgt_mask):
        return super().decode(tgt, memory, src_mask, tgt_mask[:, :, -1:, :])  # the last row: padding only


class ProbabilitiesOut(tutorial.Transformer):
    def project(self, hidden: Tensor) -> Tensor:
        return F.softmax(self.generator(hidden), dim=-1)


class UnbiasedVariance(tutorial.Transformer):
    class Norm(tutorial.LayerNorm):
        def forward(self, x: Tensor) -> Tensor:
            unbiased = x.var(-1, keepdim=True)  # torch.var's default: n - 1
            return self.a_2 * (x - x.mean(-1, keepdim=True)) / torch.sqrt(unbiased + self.eps) + self.b_2

    def __init__(self, config) -> None:
        super().__init__(config)
        self.encoder.norm.__class__ = self.Norm


@pytest.mark.parametrize(("spec", "point", "cause"), [
    (f"{FIXTURES}.bugs:Source1LayerNorm", "encoder.layers.0.norm1",
     "(x − mean) / (std + eps): the unbiased std (torch.std's default), eps outside the root"),
    (f"{FIXTURES}.bugs:ScaledBySqrtDModel", "encoder.layers.0.self_attn",
     "the scores are divided by √d_model = √32 where the reference divides by √d_k = √8"),
    (f"{FIXTURES}.bugs:LearnedPositions", "src_embed",
     "learned positions: rows of the model's own src_pos.table.weight added where the reference adds the "
     "sinusoids"),
    (f"{FIXTURES}.bugs:LearnedPositionsUnscaled", "src_embed",
     "learned positions (src_pos.table.weight) added to embeddings not scaled by √d_model = √32"),
    (f"{FIXTURES}.bugs:SwappedCrossKeysValues", "decoder.layers.1.cross_attn",
     "keys projected with W_v and values with W_k"),
    (f"{FIXTURES}.blocks:LayerNormEps", "encoder.layers.0.norm1",
     "LayerNorm eps 1e-05 (nn.LayerNorm's default) where the reference's is 1e-06"),
    (f"{FIXTURES}.residual:Eps1e12", "encoder.layers.0.norm1", "LayerNorm eps 1e-12 (BERT's)"),
    (f"{FIXTURES}.residual:EmbeddingNorm", "src_embed",
     "a LayerNorm (eps 1e-06, gain 1, shift 0) on the embeddings before the first layer"),
    (f"{FIXTURES}.residual:Logits", "generator", "logits, not log-probabilities"),
    (f"{FIXTURES}.blocks:NoFinalNormsUnprobed", "encoder.norm", "no LayerNorm here: the value is its input"),
    (f"{FIXTURES}.tuples:Sinusoids", "encoder.norm", "no LayerNorm here: the value is its input"),
    (f"{__name__}:GeluFeedForward", "encoder.layers.0.ff", "GELU where the reference has ReLU"),
    (f"{__name__}:OutputBiasUnused", "decoder.layers.0.cross_attn", "the output projection's bias left out"),
    (f"{__name__}:NoCausalMask", "decoder.layers.0.self_attn", "the causal mask left out: padding only"),
    (f"{__name__}:ProbabilitiesOut", "generator", "probabilities (softmax), not log-probabilities"),
    (f"{__name__}:UnbiasedVariance", "encoder.norm", "the unbiased variance (n − 1; torch.var's default)"),
], ids=lambda value: value.rpartition(":")[2] if ":" in str(value) else None)
def test_the_departure_a_model_carries_is_the_one_explained(spec, point, cause):
    config = POST.replace(norm_first=True) if spec.rpartition(":")[0].endswith(("blocks",)) else POST
    case = first_case(config)
    differences = locate(spec, case)
    assert first_divergence(differences, FLOAT64.atol).startswith(f"first divergence: {point} ("), \
        first_divergence(differences, FLOAT64.atol)
    line = explain_first(spec, case, 0, differences)
    assert line.startswith(f"explained: {cause}"), line


def test_a_departure_none_of_the_tried_ones_fits_is_said_so():
    spec = f"{FIXTURES}.bugs:OneProjectionForAllHeads"
    case = first_case()
    line = explain_first(spec, case, 0, locate(spec, case))
    assert re.fullmatch(r"not explained by the \d+ classic departures, wrong maps and pairs of departures "
                        r"tried at encoder\.layers\.0\.self_attn \(scale, biases, keys and values, masks, "
                        r"softmax axis, head split, W_q/W_k, heads permuted; docs/check\.md lists them\)",
                        line), line


# --- a decoder that returns (logits, attention), without a final norm ----------------------------


def test_a_tuple_returning_tutorial_is_located_without_a_traceback(capsys):
    code, lines = run([f"{FIXTURES}.tuples:Checked", "--norm", "post"], capsys)
    assert code == 1
    assert lines[-2] == "first divergence: src_embed (max |Δ| 3.9); nothing comes before it"
    assert lines[-1].startswith("explained: learned positions: rows of the model's own "
                                "encoder.pos_embedding.weight added where the reference adds the sinusoids")


def test_an_absent_final_norm_stands_in_as_the_last_layers_output_as_its_probe_reads_it():
    """tuples.Sinusoids declares no decoder final norm; its Decoder module goes on to the output
    projection and returns (logits, attention): the stand-in is the last decoder layer's item 0,
    its (B, T, D) hidden state, never the Decoder's output."""
    model = build(f"{FIXTURES}.tuples:Sinusoids", POST)
    extra = stand_ins(model)
    assert extra == {"encoder.norm": Probe("encoder.layers.1"),
                     "decoder.norm": Probe("decoder.layers.1", item=0)}
    src, tgt, src_mask, tgt_mask = random_batch(POST, 3, 7, 5).inputs()
    values = capture(model.eval(), (src, tgt, src_mask, tgt_mask), extra)
    with torch.no_grad():
        memory = model.encoder(src, src_mask)
        y = model.decoder.dropout(model.decoder.tok_embedding(tgt) * model.decoder.scale
                                  + model.decoder.positions(tgt))
        for layer in model.decoder.layers:
            y, _ = layer(y, memory, tgt_mask, src_mask)
    assert values["decoder.norm"].shape == (3, 5, POST.d_model)
    assert torch.equal(values["decoder.norm"], y) and torch.equal(values["encoder.norm"], memory)


def test_a_tuple_output_probed_without_item_is_read_at_item_0_and_said():
    model = build(f"{FIXTURES}.tuples:Sinusoids", POST).eval()
    notes: dict[str, str] = {}
    values = capture(model, random_batch(POST).inputs(), {"decoder.norm": Probe("decoder")}, notes=notes)
    assert values["decoder.norm"].shape[-1] == POST.tgt_vocab_size  # the Decoder's item 0: its logits
    assert notes == {"decoder.norm": "decoder returns a tuple: its item 0"}


def test_a_probe_that_reads_a_tuple_says_so_in_the_finders_table():
    """Probe maps that name the tuple-returning decoder layers without ``item``: compared at item 0,
    and the finder's note says so."""
    found = draft(drafting(tuples.Sinusoids)(POST), POST)
    probes = {point: Probe(probe.module) if point.startswith("decoder.layers.") and probe.item == 0 else probe
              for point, probe in found.probes.items()}
    globals()["PlainProbes"] = type("PlainProbes", (tuples.Sinusoids,), {
        "__module__": __name__, "weight_map": dict(found.weights), "probe_map": probes,
        "extra_parameters": tuple(found.unplaced)})
    layer = next(d for d in locate(f"{__name__}:PlainProbes", first_case()) if d.point == "decoder.layers.0")
    assert layer.note == "PlainProbes's decoder.layers.0 returns a tuple: its item 0", layer.note
    assert layer.max_abs is not None and layer.max_abs > 0.1  # the hidden state, past the missing final norm


def test_an_explanation_is_claimed_only_where_the_recomputation_gives_back_the_reference(monkeypatch):
    spec = f"{FIXTURES}.blocks:LayerNormEps"
    case = first_case(POST.replace(norm_first=True))
    differences = locate(spec, case)
    assert explain_first(spec, case, 0, differences).startswith("explained: LayerNorm eps 1e-05")

    def off(*args):
        tried = departures.layer_norm(*args)
        return [("as the reference", tried[0][1] + 1e-6), *tried[1:]]

    monkeypatch.setitem(departures.RECOMPUTE, "norm", off)
    assert explain_first(spec, case, 0, differences) == ""


class NotATensor(nn.Module):
    def forward(self, x: Tensor) -> dict:
        return {"out": x}


class WrappedLayer(tuples.EncoderLayer):
    """An encoder layer whose output passes through a module that returns a dict."""

    def forward(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.wrapped(super().forward(src, src_mask))["out"]


def test_a_module_that_returns_no_tensor_is_not_captured_and_said():
    model = build(f"{FIXTURES}.tuples:Sinusoids", POST).eval()
    layer = model.encoder.layers[1]
    layer.add_module("wrapped", NotATensor())
    layer.__class__ = WrappedLayer
    notes: dict[str, str] = {}
    values = capture(model, random_batch(POST).inputs(), {"encoder.norm": Probe("encoder.layers.1.wrapped")},
                     notes=notes)
    assert "encoder.norm" not in values
    assert notes == {"encoder.norm": "encoder.layers.1.wrapped returns a dict, not a tensor"}


# --- what a class must provide; --suggest-maps on a module it cannot read ------------------------


def test_a_class_that_keeps_no_config_gets_its_embedding_points_placed():
    """blog.Checked never sets self.config: the draft's forward pass runs all the same."""
    found = draft(drafting(blog.Checked)(POST), POST)
    assert not any("no forward pass" in note for note in found.notes), found.notes
    assert found.probes["src_embed"] == Probe("drop") and found.probes["tgt_embed"] == Probe("drop", 1)


class DeletedQueryWeights(blog.Checked):
    """The first step of a hand-made workaround: each head's query weight deleted."""

    def __init__(self, config) -> None:
        super().__init__(config)
        for module in self.modules():
            if isinstance(module, blog.Head):
                del module.query.weight


class UnreadableParameters(blog.Checked):
    def named_parameters(self, *args, **kwargs):
        raise RuntimeError("parameters kept elsewhere")


def test_suggest_maps_on_a_module_with_a_deleted_weight_prints_a_draft(capsys):
    assert main([f"{__name__}:DeletedQueryWeights", "--suggest-maps", "--norm", "post"]) == 0
    text = capsys.readouterr().out
    assert "# note: no forward pass (AttributeError: 'Linear' object has no attribute 'weight')" in text
    assert "'src_embed.weight': 'src_tok.weight'" in text


def test_suggest_maps_on_a_module_it_cannot_read_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([f"{__name__}:UnreadableParameters", "--suggest-maps"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "declares no weight_map, and its modules cannot be read to infer one: RuntimeError: parameters " \
           "kept elsewhere (at tests/variants/check/test_checker_blog.py:" in line, line


class UnreadableMapped(blog.Mapped):
    """Maps written (nothing is inferred when it is built), but modules the draft cannot read."""

    def named_parameters(self, *args, **kwargs):
        raise RuntimeError("parameters kept elsewhere")


def test_suggest_maps_on_a_class_with_maps_it_cannot_read_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([f"{__name__}:UnreadableMapped", "--suggest-maps", "--norm", "post"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "UnreadableMapped: --suggest-maps cannot read UnreadableMapped's modules: RuntimeError: " \
           "parameters kept elsewhere (at tests/variants/check/test_checker_blog.py:" in line, line


def test_the_float32_evidence_is_named_with_where_the_model_reads_it():
    model = build(f"{BLOG}:Checked", POST).double().eval()
    assert capture_watched(model, random_batch(POST).inputs())[2][0].startswith(
        "buffer pe holds float32 values (a table computed in float32, then cast up), at "
        "tests/fixtures/outside/blog.py:")
    norm = model.get_submodule("dec_ln")
    norm.register_forward_pre_hook(lambda _module, args: (args[0].float().double(),))  # a float32 detour
    model.pe = sinusoid_table(POST.max_seq_len, POST.d_model)  # float64: no float32 values left
    line = next(n for n, text in enumerate(Path(__file__).read_text(encoding="utf-8").splitlines(), 1)
                if "# a float32 detour" in text and "lambda" in text)
    assert capture_watched(model, random_batch(POST).inputs())[2] == [
        f"computation casts a tensor to float32, at tests/variants/check/test_checker_blog.py:{line} "
        f"in <lambda>"]


def test_the_float32_verdict_needs_float32_on_the_path():
    """The same size of difference from a float64-only model (eps 1e-12) stays a failure."""
    spec = f"{FIXTURES}.residual:Eps1e12"
    result = forward(spec, first_case(), 0, "forward")
    assert result.passed is False and result.precision is False and result.max_abs < 1e-5
    pre = POST.replace(norm_first=True)
    rounded = forward(f"{FIXTURES}.sublayers:Float32Table", first_case(pre), 0, "forward")
    assert rounded.passed is True and rounded.precision is True
    assert rounded.detail.startswith("float32 rounding only: src_embed differs by "), rounded.detail


@pytest.mark.parametrize("spec", [f"{BLOG}:Checked", f"{BLOG}:Mapped"])
def test_the_blog_model_and_its_pasted_maps_pass_the_battery(spec):
    results = run_battery(spec, config=POST.replace(n_layers=1), modes=("post",), dropout_reference="paper")
    assert all(r.passed is not False for r in results), [(r.check, r.detail) for r in results if not r.passed]
    assert {r.check for r in results if r.precision} >= {"forward float64 post-norm S=7 T=5",
                                                         "gradients float64 post-norm"}


def test_as_python_writes_stack_names_and_the_head_field():
    text = as_python(draft(drafting(blog.Checked)(POST), POST), POST, "Checked")
    assert "stack_names = {'encoder': 'enc', 'decoder': 'dec'}" in text
    assert "weight_map = {  # {h}: each head's layer, holding its rows of the canonical matrix" in text
