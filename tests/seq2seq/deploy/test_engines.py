"""The deployment engines decode the suite's tokens: CTranslate2 and ONNX Runtime through the
legacy exporter in the plain run (each under a second), ONNX Runtime through the dynamo exporter
(seconds per graph) in the slow run. Expected tokens come from the suite's own decoders on the
``explicit`` variant, which no engine is built from (the ONNX graphs are traced from ``fused``).

The weights are the seeded canonical ones with the EOS logit's bias raised, so that held-out
rows end at different steps (some at the first, some at the length limit), and padding follows
EOS; the sources carry trailing padding of different lengths.
"""

from __future__ import annotations

import pytest
import torch

from common.config import TransformerConfig
from common.masks import decoder_mask, padding_mask
from common.random_batch import random_batch
from common.weights import import_weights, init_canonical
from seq2seq.search.beam import beam_search, length_penalty
from seq2seq.search.greedy import greedy_decode
from variants import build

ctranslate = pytest.importorskip(
    "seq2seq.deploy.ctranslate", reason="the deploy extra (ctranslate2) is not installed"
)

BOS, EOS, MAX_LEN = 1, 59, 16
# raised EOS logit bias, post-norm and pre-norm: rows then end after 1 to 9 ids, or run to MAX_LEN
EOS_BIAS = {False: 2.5, True: 1.6}
NORM_SPREAD = 0.2  # of the LayerNorm gains and biases around 1 and 0


def small_config(norm_first: bool) -> TransformerConfig:
    return TransformerConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=64,
        dropout=0.0,
        src_vocab_size=60,
        tgt_vocab_size=60,
        max_seq_len=32,
        norm_first=norm_first,
    )


def weights(config: TransformerConfig, swap_kv: bool = False) -> dict[str, torch.Tensor]:
    state = init_canonical(config, seed=0)
    state["generator.bias"][EOS] = EOS_BIAS[config.norm_first]
    # LayerNorm gains and biases away from 1 and 0: with those, a post-norm stack's final norm
    # would be nearly the identity (it normalises what the last layer's norm has normalised)
    generator = torch.Generator().manual_seed(1)
    for name in state:
        if ".norm" in name or name.startswith(("encoder.norm", "decoder.norm")):
            shift = 1.0 if name.endswith("weight") else 0.0
            state[name] = shift + NORM_SPREAD * torch.randn(state[name].shape, generator=generator)
    if swap_kv:  # a deliberately wrong export: K and V exchanged in one decoder layer's self-attention
        for kind in ("weight", "bias"):
            k, v = (f"decoder.layers.0.self_attn.{p}.{kind}" for p in ("wk", "wv"))
            state[k], state[v] = state[v], state[k]
    return state


def suite_model(config: TransformerConfig, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = build("explicit", config)
    import_weights(model, state)
    return model.eval()


def held_out(config: TransformerConfig) -> torch.Tensor:
    """(12, 9) sources, row r ending in r padding ids (one real id at least)."""
    return random_batch(config, batch=12, src_len=9, tgt_len=1, seed=7).src


def teacher_forced_log_p(model: torch.nn.Module, src: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log P(Y | source) of each (B, L) row of BOS, ids, padding, summed over its real ids: (B,)."""
    with torch.no_grad():
        logp = model(src, tokens, padding_mask(src, 0), decoder_mask(tokens, 0))  # (B, L, V)
    per_id = logp[:, :-1].gather(2, tokens[:, 1:, None])[..., 0]  # (B, L - 1)
    return (per_id * (tokens[:, 1:] != 0)).sum(dim=1)


def assert_same_greedy(expected: torch.Tensor, decoded: torch.Tensor) -> None:
    """The proof: the engine's (B, L) ids are the suite's, row for row."""
    assert decoded.shape == expected.shape, f"shape {tuple(decoded.shape)} != {tuple(expected.shape)}"
    rows = (decoded != expected).any(dim=1).nonzero()[:, 0].tolist()
    assert not rows, f"rows {rows} differ"


# --- CTranslate2 ---


@pytest.fixture(scope="module", params=[False, True], ids=["post-norm", "pre-norm"])
def ct2_case(request, tmp_path_factory):
    config = small_config(norm_first=request.param)
    model = suite_model(config, weights(config))
    directory = ctranslate.export_ctranslate2(model, tmp_path_factory.mktemp("ct2"), bos_id=BOS, eos_id=EOS)
    return model, ctranslate.CTranslate2Model(directory), held_out(config)


def test_ctranslate2_greedy_is_the_suites(ct2_case):
    model, engine, src = ct2_case
    expected = greedy_decode(model, src, padding_mask(src, 0), max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    lengths = set((expected != 0).sum(dim=1).tolist())
    assert len(lengths) >= 3 and MAX_LEN in lengths and min(lengths) < MAX_LEN  # EOS, padding, the limit
    assert_same_greedy(expected, engine.greedy(src, max_len=MAX_LEN))


def test_ctranslate2_first_step_log_probs(ct2_case):
    model, engine, src = ct2_case
    mask = padding_mask(src, 0)
    with torch.no_grad():
        memory = model.encode(src, mask)
        expected = model.project(
            model.decode_step(torch.full((len(src), 1), BOS), model.start_cache(memory, mask))
        )
    logits = engine.first_log_probs(src)  # the runtime returns logits
    torch.testing.assert_close(logits.log_softmax(dim=-1), expected[:, 0])


def exported_first_step(config, directory):
    """(the model, its CTranslate2 export, the held-out sources), the first step's log-probs
    checked equal: a spec whose norms differ from the model's moves every one of them."""
    model = suite_model(config, weights(config))
    exported = ctranslate.export_ctranslate2(model, directory, bos_id=BOS, eos_id=EOS)
    engine = ctranslate.CTranslate2Model(exported)
    src = held_out(config)
    mask = padding_mask(src, 0)
    with torch.no_grad():
        cache = model.start_cache(model.encode(src, mask), mask)
        expected = model.project(model.decode_step(torch.full((len(src), 1), BOS), cache))
    torch.testing.assert_close(engine.first_log_probs(src).log_softmax(dim=-1), expected[:, 0])
    return model, engine, src


def test_ctranslate2_honours_norm_eps(tmp_path):
    """eps 0.1, where the runtime's own default would move every log-prob well past tolerance."""
    exported_first_step(small_config(norm_first=True).replace(norm_eps=0.1), tmp_path)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_ctranslate2_without_final_norms(norm_first, tmp_path):
    """A model without final norms (Marian's, and what export_hf takes): none in the spec either.
    A spec that kept one would normalise the decoder's output again and move every log-prob."""
    model, engine, src = exported_first_step(small_config(norm_first=norm_first).replace(final_norm=False),
                                             tmp_path)
    expected = greedy_decode(model, src, padding_mask(src, 0), max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    assert_same_greedy(expected, engine.greedy(src, max_len=MAX_LEN))


def test_ctranslate2_encoder_output(ct2_case, tmp_path):
    """The encoder stack alone (ctranslate2.Encoder over the same encoder spec): the final norm in
    post-norm, the sinusoid table, the embedding scale and eps."""
    from ctranslate2 import Encoder
    from ctranslate2.specs.transformer_spec import TransformerEncoderModelSpec

    from common.weights import export_weights

    model, _, src = ct2_case
    spec = TransformerEncoderModelSpec(ctranslate.encoder_spec(export_weights(model), model.config))
    spec.register_vocabulary([ctranslate.token(i) for i in range(model.config.src_vocab_size)])
    spec.config.layer_norm_epsilon, spec.config.unk_token = model.config.norm_eps, ctranslate.token(0)
    spec.validate()
    spec.save(str(tmp_path))
    full = src[:, :1].repeat(1, 5)  # no padding: the encoder model attends to every id it is given
    output = Encoder(str(tmp_path), device="cpu").forward_batch(
        [[ctranslate.token(i) for i in row] for row in full.tolist()]
    )
    with torch.no_grad():
        expected = model.encode(full)
    import numpy as np

    torch.testing.assert_close(torch.from_numpy(np.asarray(output.last_hidden_state)), expected)


def test_ctranslate2_beam_without_length_penalty_is_the_suites(ct2_case):
    """alpha = 0: both penalties are 1, so the searches rank alike: same hypotheses and scores."""
    model, engine, src = ct2_case
    expected = beam_search(
        model, src, padding_mask(src, 0), bos_id=BOS, eos_id=EOS, alpha=0.0, max_len=MAX_LEN
    )
    got = engine.beam(src, max_len=MAX_LEN, alpha=0.0)
    assert_same_greedy(expected.tokens, got.tokens)
    torch.testing.assert_close(got.scores, expected.scores.float())


def test_ctranslate2_beam_scores_with_its_own_length_penalty(ct2_case):
    """alpha = 0.6: CTranslate2 scores log P / |Y|^alpha, |Y| counting EOS, not GNMT's penalty."""
    model, engine, src = ct2_case
    got = engine.beam(src, max_len=MAX_LEN, alpha=0.6)
    log_p = teacher_forced_log_p(model, src, got.tokens)
    generated = (got.tokens[:, 1:] != 0).sum(dim=1)  # |Y|, EOS included
    torch.testing.assert_close(got.scores, log_p / generated**0.6)
    gnmt = log_p / length_penalty(generated, 0.6)
    assert (gnmt - got.scores).abs().max() > 0.1  # the suite's penalty would score them otherwise


def test_ctranslate2_with_k_and_v_swapped_fails_the_proof(tmp_path):
    config = small_config(norm_first=False)
    model = suite_model(config, weights(config))
    wrong = suite_model(config, weights(config, swap_kv=True))
    engine = ctranslate.CTranslate2Model(
        ctranslate.export_ctranslate2(wrong, tmp_path, bos_id=BOS, eos_id=EOS)
    )
    src = held_out(config)
    expected = greedy_decode(model, src, padding_mask(src, 0), max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    with pytest.raises(AssertionError, match=r"differ|shape"):
        assert_same_greedy(expected, engine.greedy(src, max_len=MAX_LEN))


def test_ctranslate2_refuses_a_directory_that_holds_files_unless_told_to_overwrite(tmp_path):
    config = small_config(norm_first=False)
    first, second = suite_model(config, weights(config)), suite_model(config, weights(config, swap_kv=True))
    directory = ctranslate.export_ctranslate2(first, tmp_path / "ct2", bos_id=BOS, eos_id=EOS)
    written = {path.name: path.read_bytes() for path in directory.iterdir()}
    with pytest.raises(FileExistsError, match=r"already holds files; pass overwrite=True"):
        ctranslate.export_ctranslate2(second, directory, bos_id=BOS, eos_id=EOS)
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == written  # untouched
    ctranslate.export_ctranslate2(second, directory, bos_id=BOS, eos_id=EOS, overwrite=True)
    assert (directory / "model.bin").read_bytes() != written["model.bin"]  # the second model's now


def test_ctranslate2_still_takes_the_post_norm_final_norm_it_does_not_declare():
    """The exporter's one use of CTranslate2's private behaviour, watched: its specs declare a
    stack's final LayerNorm only for pre-norm, so the exporter sets it on the frozen post-norm
    spec. If a release declares it, use the declared field; if a release refuses it or drops it
    from the saved variables, the post-norm rows above would decode another function."""
    from ctranslate2.specs import transformer_spec as specs

    for stack in (specs.TransformerEncoderSpec, specs.TransformerDecoderSpec):
        assert not hasattr(stack(2, 4, pre_norm=False), "layer_norm"), (
            f"CTranslate2 {ctranslate.ctranslate2.__version__} declares {stack.__name__}.layer_norm "
            "in post-norm: set it through the declared field and drop object.__setattr__")
    config = small_config(norm_first=False)
    canonical = weights(config)
    for spec, name in [(ctranslate.encoder_spec(canonical, config), "encoder.norm"),
                       (ctranslate.decoder_spec(canonical, config), "decoder.norm")]:
        saved = spec.variables()
        assert "layer_norm/gamma" in saved and "layer_norm/beta" in saved, sorted(saved)[:8]
        torch.testing.assert_close(torch.from_numpy(saved["layer_norm/gamma"]), canonical[f"{name}.weight"])


def test_ctranslate2_int8_decodes(ct2_case):
    _, engine, src = ct2_case
    int8 = ctranslate.CTranslate2Model(engine.directory, compute_type="int8")
    tokens = int8.greedy(src, max_len=MAX_LEN)
    assert tokens.shape[0] == len(src) and tokens.shape[1] <= MAX_LEN and (tokens[:, 0] == BOS).all()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda src: src.index_fill(1, torch.tensor([0]), 0), "src row 0 has padding .* before a real id"),
        (lambda src: src.masked_fill(src == src.max(), 60), r"src ids must lie in \[0, 60\)"),
        (lambda src: src.float(), "integer tensor"),
        (lambda src: torch.zeros(2, 3, dtype=torch.long), "row 0 is all padding"),
    ],
)
def test_ctranslate2_refuses_bad_sources(ct2_case, change, message):
    _, engine, src = ct2_case
    with pytest.raises((TypeError, ValueError), match=message):
        engine.greedy(change(src), max_len=MAX_LEN)


def test_ctranslate2_refuses_bad_settings(ct2_case, tmp_path):
    _, engine, src = ct2_case
    with pytest.raises(ValueError, match=r"max_len must be an int in \[1, max_seq_len=32\]"):
        engine.greedy(src, max_len=33)
    with pytest.raises(ValueError, match="compute_type must be one of"):
        ctranslate.CTranslate2Model(engine.directory, compute_type="int4")
    with pytest.raises(ValueError, match=r"suite_config\.json not found"):
        ctranslate.CTranslate2Model(tmp_path)


# --- ONNX Runtime (the dynamo exporter's case is slow: seconds per graph) ---


@pytest.fixture(scope="module")
def onnx_runtime():
    return pytest.importorskip(
        "seq2seq.deploy.onnx_runtime",
        reason="the deploy extra (onnx, onnxscript, onnxruntime) is not installed",
    )


@pytest.fixture(
    scope="module",
    params=[pytest.param((False, "dynamo"), marks=pytest.mark.slow), (True, "torchscript")],
    ids=["post-norm-dynamo", "pre-norm-torchscript"],
)
def ort_case(request, onnx_runtime, tmp_path_factory):
    """Post-norm through the default exporter, pre-norm through the legacy one (ten times faster)."""
    norm_first, exporter = request.param
    config = small_config(norm_first)
    model = suite_model(config, weights(config))
    directory = onnx_runtime.export_onnx(model, tmp_path_factory.mktemp("onnx"), exporter=exporter)
    return model, onnx_runtime.OnnxRuntimeModel(directory), held_out(config)


def test_onnx_runtime_greedy_is_the_suites(ort_case):
    model, engine, src = ort_case
    mask = padding_mask(src, 0)
    expected = greedy_decode(model, src, mask, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    assert_same_greedy(expected, greedy_decode(engine, src, mask, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS))


def test_onnx_runtime_beam_is_the_suites(ort_case):
    """The suite's beam search drives the sessions: same length penalty, same hypotheses."""
    model, engine, src = ort_case
    mask = padding_mask(src, 0)
    expected = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=MAX_LEN)
    got = beam_search(engine, src, mask, bos_id=BOS, eos_id=EOS, max_len=MAX_LEN)
    assert_same_greedy(expected.tokens, got.tokens)
    torch.testing.assert_close(got.scores, expected.scores)


def test_onnx_runtime_encoder_output_and_first_step(ort_case):
    model, engine, src = ort_case
    mask = padding_mask(src, 0)
    bos = torch.full((len(src), 1), BOS)
    with torch.no_grad():
        memory = model.encode(src, mask)
        expected = model.project(model.decode_step(bos, model.start_cache(memory, mask)))
    got_memory = engine.encode(src, mask)
    torch.testing.assert_close(got_memory[mask[:, 0, 0]], memory[mask[:, 0, 0]])  # real positions
    torch.testing.assert_close(
        engine.project(engine.decode_step(bos, engine.start_cache(got_memory, mask))), expected
    )


def test_onnx_runtime_with_k_and_v_swapped_fails_the_proof(onnx_runtime, tmp_path):
    config = small_config(norm_first=False)
    model = suite_model(config, weights(config))
    wrong = suite_model(config, weights(config, swap_kv=True))
    engine = onnx_runtime.OnnxRuntimeModel(onnx_runtime.export_onnx(wrong, tmp_path, exporter="torchscript"))
    src = held_out(config)
    mask = padding_mask(src, 0)
    expected = greedy_decode(model, src, mask, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    with pytest.raises(AssertionError, match=r"differ|shape"):
        assert_same_greedy(
            expected, greedy_decode(engine, src, mask, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
        )


def test_onnx_runtime_int8_and_bad_input(onnx_runtime, ort_case):
    _, engine, src = ort_case
    directory = engine.directory
    with pytest.raises(ValueError, match="make them with quantize_int8"):
        onnx_runtime.OnnxRuntimeModel(directory, precision="int8")
    onnx_runtime.quantize_int8(directory)
    int8 = onnx_runtime.OnnxRuntimeModel(directory, precision="int8")
    tokens = greedy_decode(int8, src, padding_mask(src, 0), max_len=MAX_LEN, bos_id=BOS, eos_id=EOS)
    assert tokens.shape[0] == len(src) and (tokens[:, 0] == BOS).all()
    with pytest.raises(ValueError, match=r"src ids must lie in \[0, 60\)"):
        engine.encode(src + 60)
    with pytest.raises(NotImplementedError, match=r"use_cache=True"):
        greedy_decode(engine, src, max_len=MAX_LEN, bos_id=BOS, eos_id=EOS, use_cache=False)
    cache = engine.start_cache(engine.encode(src), None)
    with pytest.raises(ValueError, match="one new id per cached row"):
        engine.decode_step(torch.ones(2, 1, dtype=torch.long), cache)
