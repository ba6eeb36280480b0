"""The config fields for checkpoints trained elsewhere (Hugging Face's Marian, fairseq's WMT19),
in every row: the feed-forward activation, no final LayerNorm, Marian's and fairseq's sinusoid
tables, a decoder feed-forward width of its own, and a decoder that starts with the padding id
or with EOS (docs/architecture.md, "Config").

Each field value is checked twice: all five rows agree after ``transfer`` (float64 within the
suite's 1e-10), and every row equals ``functional_forward`` (tests/equivalence/test_dropout.py),
which writes the architecture out from canonical weights with each field's effect computed here:
the activations from their equations, the tables from Hugging Face's and fairseq's formulas, the
decoder's self-attention mask built by hand. The tables are also checked alone.
"""

from __future__ import annotations

import pytest
import torch

from common.config import TransformerConfig
from common.masks import causal_mask, decoder_mask, padding_mask
from common.positions import position_table, sinusoid_table
from common.probes import capture, probe_points, resolve_probes
from common.random_batch import random_batch
from common.weights import canonical_shapes, export_gradients, export_weights, import_weights, transfer
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.equivalence.test_dropout import (
    fairseq_sinusoids,
    functional_forward,
    marian_sinusoids,
    sinusoids,
)
from tests.helpers import FLOAT64_TOL, random_canonical, reference_and, small_config
from variants import FROM_SCRATCH, REFERENCE, VARIANTS, build

EOS = 2
# one checkpoint family each, scaled down: Marian (swish, tied, no final norm, its table, the
# decoder starting with the padding id) and fairseq's WMT19 (relu, no final norm, its table
# with pad_id 1, decoder FFN narrower than the encoder's, the decoder starting with EOS)
MARIAN = dict(activation="silu", final_norm=False, positions="marian", share_embeddings=True,
              src_vocab_size=19, decoder_start="pad", pad_id=4, norm_eps=1e-5)
FSMT = dict(final_norm=False, positions="fairseq", decoder_d_ff=24, decoder_start="eos", pad_id=1,
            norm_eps=1e-5)
FIELD_LAYOUTS = {
    "silu": dict(activation="silu"),
    "gelu": dict(activation="gelu"),
    "no-final-norm": dict(final_norm=False),
    "no-final-norm-pre-norm": dict(final_norm=False, norm_first=True),
    "marian-positions": dict(positions="marian"),
    "fairseq-positions": dict(positions="fairseq", pad_id=1),
    "fairseq-positions-odd-width": dict(positions="fairseq", pad_id=3, d_model=33, n_heads=3),
    "decoder-d-ff": dict(decoder_d_ff=24),
    "marian-like": MARIAN,
    "fsmt-like": FSMT,
}
FIELD_CONFIGS = tuple(small_config(**fields) for fields in FIELD_LAYOUTS.values())
LAYOUTS = pytest.mark.parametrize("config", FIELD_CONFIGS, ids=list(FIELD_LAYOUTS))
FAMILIES = pytest.mark.parametrize("config", [small_config(**MARIAN), small_config(**FSMT)],
                                   ids=["marian-like", "fsmt-like"])


def start_id(config: TransformerConfig) -> int:
    """The decoder's first id under ``config.decoder_start``: a BOS of its own (1, or 3 where 1
    is the padding id), the padding id, or EOS."""
    bos = 3 if config.pad_id == 1 else 1
    return {"bos": bos, "pad": config.pad_id, "eos": EOS}[config.decoder_start]


def batch_with_start(config: TransformerConfig, batch: int = 3, src_len: int = 7, tgt_len: int = 5):
    """random_batch's padded ids (row r ends in r padding ids), the targets starting with the
    start id, with the suite's masks (common.masks) for the model."""
    src, tgt, _, _ = random_batch(config, batch, src_len, tgt_len).inputs()
    tgt[:, 0] = start_id(config)
    return src, tgt, padding_mask(src, config.pad_id), decoder_mask(tgt, config.pad_id)


def float64_model(variant: str, config: TransformerConfig) -> torch.nn.Module:
    """``variant`` built for ``config`` with random canonical weights, in float64, eval mode."""
    model = build(variant, config)
    import_weights(model, random_canonical(config))
    return model.double().eval()


def masks_by_hand(config: TransformerConfig, src: torch.Tensor, tgt: torch.Tensor):
    """The masks written out here, for the functional forward: source keys that are not padding;
    target keys causal and not padding, except position 0, the start token, whatever its id."""
    src_keys = (src != config.pad_id)[:, None, None, :]  # (B, 1, 1, S)
    tgt_keys = tgt != config.pad_id  # (B, T)
    tgt_keys[:, 0] = True
    causal = torch.ones(tgt.shape[1], tgt.shape[1], dtype=torch.bool).tril()  # (T, T)
    return src_keys, tgt_keys[:, None, None, :] & causal


def written_out(model, config: TransformerConfig, src, tgt, **options) -> torch.Tensor:
    """``functional_forward`` on the model's canonical weights, in float64, without dropout."""
    state = {name: tensor.double() for name, tensor in export_weights(model).items()}
    return functional_forward(state, config, src, tgt, *masks_by_hand(config, src, tgt), p=0.0, **options)


# --- every row, every field value: the reference's function, and the written-out one ----------


@LAYOUTS
def test_log_probs_match_reference(subject_variant, config):
    reference, model = reference_and(subject_variant, config)
    inputs = batch_with_start(config)
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs), reference(*inputs))
        reference.double(), model.double()
        torch.testing.assert_close(model(*inputs), reference(*inputs), **FLOAT64_TOL)


@LAYOUTS
def test_log_probs_are_the_written_out_architecture(variant, config):
    """Each field's effect computed independently: an activation, a final norm, a table or a
    start-token mask that a row got wrong moves the log-probs far past 1e-10."""
    model = float64_model(variant, config)
    src, tgt, src_mask, tgt_mask = batch_with_start(config)
    with torch.no_grad():
        actual = model(src, tgt, src_mask, tgt_mask)
    torch.testing.assert_close(actual, written_out(model, config, src, tgt), **FLOAT64_TOL)


@pytest.mark.parametrize("name", [name for name, fields in FIELD_LAYOUTS.items()
                                  if {"activation", "final_norm", "positions"} & set(fields)][:7])
def test_each_field_value_changes_the_function(name):
    """The written-out forward under each single field value differs from the same weights under
    the paper's value of that field by far more than 1e-10, so a row that ignored the field
    would fail the test above (the decoder's width: ``test_the_decoder_width_is_...`` below)."""
    config = small_config(**FIELD_LAYOUTS[name])
    changed = {"activation", "final_norm", "positions"} & set(FIELD_LAYOUTS[name])
    paper = config.replace(**{field: getattr(TransformerConfig(), field) for field in changed})
    src, tgt, _, _ = batch_with_start(config)
    state = {name: tensor.double() for name, tensor in random_canonical(config).items()}
    masks = masks_by_hand(config, src, tgt)
    ours = functional_forward(state, config, src, tgt, *masks, p=0.0)
    state_paper = {n: t for n, t in state.items() if n in canonical_shapes(paper)}
    if "final_norm" in changed:  # the paper's final norms, as an identity LayerNorm: not a no-op
        state_paper.update({name: torch.ones(shape, dtype=torch.float64) if name.endswith("weight")
                            else torch.zeros(shape, dtype=torch.float64)
                            for name, shape in canonical_shapes(paper).items() if name not in state})
    theirs = functional_forward(state_paper, paper, src, tgt, *masks, p=0.0)
    assert (ours - theirs).abs().max() > 0.01


def widened_decoder(weights: dict[str, torch.Tensor], config: TransformerConfig) -> dict[str, torch.Tensor]:
    """The decoder's feed-forward weights at the encoder's width d_ff, the extra units zero."""
    extra = config.d_ff - config.decoder_ff_dim
    wide = {}
    for i in range(config.n_layers):
        at = f"decoder.layers.{i}.ff"
        wide[f"{at}.w1.weight"] = torch.cat([weights[f"{at}.w1.weight"], torch.zeros(extra, config.d_model)])
        wide[f"{at}.w1.bias"] = torch.cat([weights[f"{at}.w1.bias"], torch.zeros(extra)])
        wide[f"{at}.w2.weight"] = torch.cat([weights[f"{at}.w2.weight"], torch.zeros(config.d_model, extra)],
                                            dim=1)
    return wide


def test_the_decoder_width_is_a_function_of_its_own():
    """decoder_d_ff's effect, checked by construction: the narrower decoder's log-probs are the
    paper-width decoder's whose extra units are zero (so the written-out forward above honours
    the width through the weights' shapes, and the single-field check compares like with like)."""
    config = small_config(decoder_d_ff=24)
    paper = config.replace(decoder_d_ff=None)
    weights = random_canonical(config)
    wide = {**weights, **widened_decoder(weights, config)}
    src, tgt, src_mask, tgt_mask = batch_with_start(config)
    narrow_model, wide_model = build("explicit", config), build("explicit", paper)
    import_weights(narrow_model, weights)
    import_weights(wide_model, wide)
    with torch.no_grad():
        narrow = narrow_model.double().eval()(src, tgt, src_mask, tgt_mask)
        torch.testing.assert_close(wide_model.double().eval()(src, tgt, src_mask, tgt_mask), narrow,
                                   **FLOAT64_TOL)


@FAMILIES
def test_gradients_match_reference(subject_variant, config):
    config = config.replace(dropout=0.0)
    reference, model = reference_and(subject_variant, config)
    src, tgt, src_mask, tgt_mask = batch_with_start(config)
    grads = []
    for m in (reference, model):
        m.double().train()
        log_probs = m(src, tgt, src_mask, tgt_mask)
        torch.nn.functional.nll_loss(log_probs[:, :-1].flatten(0, 1), tgt[:, 1:].flatten(),
                                     ignore_index=config.pad_id).backward()
        grads.append(export_gradients(m))
    expected, actual = grads
    assert actual.keys() == expected.keys() == canonical_shapes(config).keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], **FLOAT64_TOL, msg=name)


# --- the tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("d_model", [32, 33])
def test_marian_table_is_hugging_faces(d_model):
    config = small_config(positions="marian", d_model=d_model, n_heads=1)
    table = position_table(config)
    assert table.dtype == torch.float64 and table.shape == (config.max_seq_len, d_model)
    torch.testing.assert_close(table, marian_sinusoids(config.max_seq_len, d_model), atol=1e-12, rtol=0)
    # a fixed permutation of the paper's columns: its sines first, then its cosines
    paper = sinusoids(config.max_seq_len, d_model)
    torch.testing.assert_close(table, torch.cat([paper[:, 0::2], paper[:, 1::2]], 1), atol=1e-12, rtol=0)


@pytest.mark.parametrize("d_model", [32, 33])
@pytest.mark.parametrize("pad_id", [0, 1, 3])
def test_fairseq_table_is_fairseqs_from_its_first_position(d_model, pad_id):
    """Row p is fairseq's position p + pad_id + 1: its first real token's, not its padding row
    (zero) nor the row before."""
    config = small_config(positions="fairseq", d_model=d_model, n_heads=1, pad_id=pad_id)
    table = position_table(config)
    length = config.max_seq_len
    fairseq = fairseq_sinusoids(length + pad_id + 1, d_model, pad_id)
    assert table.dtype == torch.float64 and table.shape == (length, d_model)
    torch.testing.assert_close(table, fairseq[pad_id + 1:], atol=1e-12, rtol=0)
    assert not torch.allclose(table, fairseq[pad_id:-1])  # offset by one: another table
    assert fairseq[pad_id].abs().max() == 0 and table.abs().sum(dim=1).min() > 1  # no zero row here
    if d_model % 2:
        assert table[:, -1].abs().max() == 0  # an odd width ends in fairseq's zero column


def test_the_paper_table_is_unchanged():
    config = small_config()
    assert torch.equal(position_table(config), sinusoid_table(config.max_seq_len, config.d_model))
    torch.testing.assert_close(position_table(config), sinusoids(config.max_seq_len, config.d_model),
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("positions", ["marian", "fairseq"])
def test_every_row_adds_the_table_in_float64_and_saves_none(variant, positions):
    config = small_config(positions=positions, pad_id=1, dropout=0.0)
    model = build(variant, config)
    tables = [buffer for name, buffer in model.named_buffers() if buffer.shape == (config.max_seq_len,
                                                                                  config.d_model)]
    assert tables and all(table.dtype == torch.float64 for table in tables)
    assert all(torch.allclose(table, position_table(config), atol=1e-12, rtol=0) for table in tables)
    assert not any(tensor.dtype == torch.float64 for tensor in model.state_dict().values())


@pytest.mark.parametrize("pad_id", [1, 3])
def test_fairseq_padding_positions_differ_only_where_nothing_reads_them(variant, pad_id):
    """fairseq gives a padding token its zero row (make_positions); the rows give it its index's,
    as for any token. The real target positions' log-probs are fairseq's within 1e-10; only the
    padded ones, which no real position reads, differ (docs/architecture.md, "Config")."""
    config = small_config(**{**FSMT, "pad_id": pad_id})
    model = float64_model(variant, config)
    src, tgt, src_mask, tgt_mask = batch_with_start(config)
    with torch.no_grad():
        actual = model(src, tgt, src_mask, tgt_mask)
    fairseq = written_out(model, config, src, tgt, fairseq_padding=True)
    real = tgt != config.pad_id
    torch.testing.assert_close(actual[real], fairseq[real], **FLOAT64_TOL)
    assert (actual[~real] - fairseq[~real]).abs().max() > 1e-6


# --- no final LayerNorm ---------------------------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_no_final_norm_has_no_final_norm_weights_or_points(variant, norm_first):
    config = small_config(final_norm=False, norm_first=norm_first)
    finals = {"encoder.norm.weight", "encoder.norm.bias", "decoder.norm.weight", "decoder.norm.bias"}
    assert finals.isdisjoint(canonical_shapes(config))
    assert finals <= set(canonical_shapes(config.replace(final_norm=True)))
    assert {"encoder.norm", "decoder.norm"}.isdisjoint(probe_points(config))
    model = build(variant, config, seed=0)
    assert export_weights(model).keys() == canonical_shapes(config).keys()  # and no parameter left over
    assert list(resolve_probes(model)) == probe_points(config)
    src, tgt, src_mask, tgt_mask = random_batch(config).inputs()
    captured = capture(model.eval(), (src, tgt, src_mask, tgt_mask))
    declared = [point for point, probe in resolve_probes(model).items() if probe is not None]
    assert list(captured) == declared


def test_an_identity_final_norm_is_not_a_no_op():
    """A final LayerNorm with gain 1 and bias 0 still re-normalises: leaving one in where the
    checkpoint has none moves the log-probs by O(1)."""
    config = small_config(final_norm=False)
    weights = random_canonical(config)
    with_norm = build("explicit", config.replace(final_norm=True))
    identity = {name: torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
                for name, shape in canonical_shapes(with_norm.config).items() if name not in weights}
    import_weights(with_norm, {**weights, **identity})
    without = build("explicit", config)
    import_weights(without, weights)
    src, tgt, src_mask, tgt_mask = random_batch(config).inputs()
    with torch.no_grad():
        difference = with_norm.double().eval()(src, tgt, src_mask, tgt_mask) - without.double().eval()(
            src, tgt, src_mask, tgt_mask)
    assert difference.abs().max() > 0.1


# --- weights between configs --------------------------------------------------------------


@pytest.mark.parametrize(("changes", "field"), [
    (dict(activation="silu"), "activation"),
    (dict(positions="marian"), "positions"),
    (dict(decoder_d_ff=24), "decoder_ff_dim"),
    (dict(final_norm=False), "final_norm"),
])
def test_transfer_refuses_another_architecture(changes, field):
    """The same tensors under another activation or table would be another function; another
    width or no final norm would not fit: import names the field."""
    source, destination = build("explicit", small_config(**changes)), build("fused", small_config())
    with pytest.raises(ValueError, match=rf"config field {field}\b"):
        transfer(source, destination)


def test_decoder_width_is_the_decoders_alone(variant):
    config = small_config(decoder_d_ff=24)
    shapes = canonical_shapes(config)
    for stack, width in (("encoder", 48), ("decoder", 24)):
        assert shapes[f"{stack}.layers.0.ff.w1.weight"] == (width, 32)
        assert shapes[f"{stack}.layers.1.ff.w2.weight"] == (32, width)
    exported = export_weights(build(variant, config))
    assert {name: tuple(t.shape) for name, t in exported.items()} == shapes


# --- the decoder's start id -----------------------------------------------------------------


@FAMILIES
def test_cached_steps_equal_the_full_decode_from_the_start_id(subject_variant, config):
    """decode_step builds its own mask of the ids so far (common.interface): the start token at
    position 0 is a key there too, whatever its id, as in decoder_mask."""
    model = build(subject_variant, config)
    import_weights(model, random_canonical(config))
    model.double().eval()
    src, tgt, src_mask, _ = batch_with_start(config, tgt_len=6)
    tgt[1, 3:] = config.pad_id  # a row that ended, padding after it
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        cache = model.start_cache(memory, src_mask)
        for t in range(tgt.shape[1]):
            prefix = tgt[:, : t + 1]
            step = model.project(model.decode_step(prefix[:, -1:], cache))[:, 0]
            full = written_out(model, config, src, prefix)[:, -1]
            torch.testing.assert_close(step, full, **FLOAT64_TOL, msg=f"step {t}")


def greedy_by_hand(model, config: TransformerConfig, src: torch.Tensor, max_len: int) -> torch.Tensor:
    """Greedy decoding written out on the functional forward: the start id, then the argmax of
    the full recompute, padding after EOS (no row here ends early: compared up to max_len)."""
    tokens = torch.full((src.shape[0], 1), start_id(config))
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len - 1):
        next_token = written_out(model, config, src, tokens)[:, -1].argmax(-1)
        next_token = next_token.masked_fill(finished, config.pad_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == EOS
        if finished.all():
            break
    return tokens


@FAMILIES
def test_greedy_decoding_from_the_start_id_is_the_written_out_one(variant, config):
    """A Marian-like decoder starts with the padding id, an FSMT-like one with EOS: the search
    takes the start id (config.decoder_start), never reads the start as an end, and gives the
    tokens of greedy decoding written out by hand, cached or not."""
    model = float64_model(variant, config)
    src, _, src_mask, _ = batch_with_start(config)
    expected = greedy_by_hand(model, config, src, max_len=8)
    for use_cache in (True, False):
        tokens = greedy_decode(model, src, src_mask, max_len=8, bos_id=start_id(config), eos_id=EOS,
                               use_cache=use_cache)
        assert torch.equal(tokens, expected)
    assert expected.shape[1] > 2  # it went on after the start, also where the start is EOS
    best = beam_search(model, src, src_mask, bos_id=start_id(config), eos_id=EOS, beam_size=1, max_len=8)
    assert torch.equal(best.tokens, expected)


@pytest.mark.parametrize(("decoder_start", "bos_id", "message"), [
    ("pad", 1, r"decoder_start is 'pad'.*bos_id must be 4, got 1"),
    ("eos", 1, r"decoder_start is 'eos'.*bos_id must equal eos_id \(2\), got 1"),
    ("bos", 4, r"bos_id must differ from config\.pad_id \(4\).*decoder_start='pad'"),
    ("bos", EOS, r"bos_id and eos_id must differ, both are 2.*decoder_start='eos'"),
])
def test_the_search_takes_the_start_id_the_config_names(decoder_start, bos_id, message):
    """A start id equal to padding or EOS only where the model was trained so; an EOS equal to
    padding never."""
    config = small_config(pad_id=4, decoder_start=decoder_start)
    model = build("explicit", config)
    src = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match=message):
        greedy_decode(model, src, max_len=4, bos_id=bos_id, eos_id=EOS)
    with pytest.raises(ValueError, match=r"eos_id must differ from config\.pad_id \(4\)"):
        greedy_decode(model, src, max_len=4, bos_id=start_id(config), eos_id=4)


def test_decoder_mask_keeps_the_start_column_whatever_its_id():
    """Column 0 is the start token: a key even when it is the padding id; any other padding is
    masked as before."""
    tgt = torch.tensor([[4, 5, 4, 4], [7, 4, 4, 4]])
    expected = torch.tensor([[True, True, False, False], [True, False, False, False]])
    mask = decoder_mask(tgt, pad_id=4)
    assert torch.equal(mask, expected[:, None, None, :] & causal_mask(4))
    assert torch.equal(decoder_mask(tgt[1:], 4), padding_mask(tgt[1:], 4) & causal_mask(4))


def test_a_decoder_mask_that_masked_the_start_would_be_caught():
    """The check above on a mask that hides a padding start: the Marian-like log-probs move far
    past 1e-10 (its first query sees no key)."""
    config = small_config(**MARIAN)
    model = build("explicit", config)
    import_weights(model, random_canonical(config))
    model.double().eval()
    src, tgt, src_mask, _ = batch_with_start(config)
    wrong = padding_mask(tgt, config.pad_id) & causal_mask(tgt.shape[1])
    with torch.no_grad():
        moved = model(src, tgt, src_mask, wrong) - written_out(model, config, src, tgt)
    assert moved.abs().max() > 0.1


def test_field_configs_exercise_every_new_field():
    new_fields = ("activation", "final_norm", "positions", "decoder_d_ff", "decoder_start")
    default = TransformerConfig()
    values = {field: {getattr(config, field) for config in FIELD_CONFIGS} - {getattr(default, field)}
              for field in new_fields}
    assert values == {"activation": {"silu", "gelu"}, "final_norm": {False},
                      "positions": {"marian", "fairseq"}, "decoder_d_ff": {24},
                      "decoder_start": {"pad", "eos"}}
    assert REFERENCE in VARIANTS and set(FROM_SCRATCH) | {REFERENCE} == set(VARIANTS)


# --- the engines that trace a row ---------------------------------------------------------


@FAMILIES
def test_the_onnx_export_decodes_as_the_suite(config, tmp_path):
    """ONNX Runtime runs the fused row's graphs, traced: they honour every field, and its own
    decode-step mask keeps the start token a key (docs/deployment.md); CTranslate2's export
    refuses the fields, naming them."""
    onnx_runtime = pytest.importorskip("seq2seq.deploy.onnx_runtime",
                                       reason="the deploy extra (onnx, onnxruntime) is not installed")
    model = build("fused", config)
    import_weights(model, random_canonical(config))
    model.eval()
    engine = onnx_runtime.OnnxRuntimeModel(onnx_runtime.export_onnx(model, tmp_path, exporter="torchscript"))
    src, tgt, src_mask, _ = batch_with_start(config)
    with torch.no_grad():
        cache = model.start_cache(model.encode(src, src_mask), src_mask)
        engine_cache = engine.start_cache(engine.encode(src, src_mask), src_mask)
        for t in range(tgt.shape[1]):  # the steps from the start token on, both in float32
            step = tgt[:, t:t + 1]
            torch.testing.assert_close(engine.project(engine.decode_step(step, engine_cache)),
                                       model.project(model.decode_step(step, cache)), msg=f"step {t}")
    arguments = dict(bos_id=start_id(config), eos_id=EOS, max_len=8)
    assert torch.equal(greedy_decode(engine, src, src_mask, **arguments),
                       greedy_decode(model, src, src_mask, **arguments))
    ctranslate = pytest.importorskip("seq2seq.deploy.ctranslate", reason="the deploy extra is not installed")
    named = "activation='silu', positions=" if config.activation == "silu" else "positions="
    with pytest.raises(ValueError, match=rf"paper's architecture only; this model has {named}"):
        ctranslate.export_ctranslate2(model, tmp_path / "ct2", bos_id=start_id(config), eos_id=EOS)
