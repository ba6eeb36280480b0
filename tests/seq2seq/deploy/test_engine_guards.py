"""The engines check what they are given as the variants do (ids, shapes, dtypes, settings), before
their runtime sees it, and run the precision and threads they are asked for."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from common.masks import padding_mask
from seq2seq.search.greedy import greedy_decode
from tests.seq2seq.deploy.test_engines import BOS, EOS, MAX_LEN, held_out, small_config, suite_model, weights

ctranslate = pytest.importorskip("seq2seq.deploy.ctranslate", reason="the deploy extra is not installed")
onnx_runtime = pytest.importorskip("seq2seq.deploy.onnx_runtime", reason="the deploy extra is not installed")
onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def model():
    config = small_config(norm_first=False)
    return suite_model(config, weights(config))


@pytest.fixture(scope="module")
def ct2(model, tmp_path_factory):
    return ctranslate.export_ctranslate2(model, tmp_path_factory.mktemp("ct2"), bos_id=BOS, eos_id=EOS)


@pytest.fixture(scope="module")
def ort(model, tmp_path_factory):
    directory = onnx_runtime.export_onnx(model, tmp_path_factory.mktemp("onnx"), exporter="torchscript")
    onnx_runtime.quantize_int8(directory)
    return directory


# --- CTranslate2 ---


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda e, src: e.beam(src, max_len=MAX_LEN, beam_size=0), ValueError,
     "beam_size must be at least 1, got 0"),
    (lambda e, src: e.beam(src, max_len=MAX_LEN, beam_size=2.0), TypeError, "beam_size must be an int"),
    (lambda e, src: e.beam(src, max_len=MAX_LEN, alpha=math.nan), ValueError, "alpha"),
    (lambda e, src: e.beam(src, max_len=MAX_LEN, alpha=-0.5), ValueError, "alpha"),
    (lambda e, src: e.greedy(src.float(), max_len=MAX_LEN), TypeError, "integer tensor"),
    (lambda e, src: e.greedy(src - 1, max_len=MAX_LEN), ValueError, r"src ids must lie in \[0, 60\)"),
    (lambda e, src: e.greedy(src[0], max_len=MAX_LEN), ValueError, "src"),
    (lambda e, src: e.greedy(src, max_len=0), ValueError, "max_len must be an int in"),
])
def test_ctranslate2_refuses_bad_arguments_before_its_runtime(ct2, call, error, message):
    engine = ctranslate.CTranslate2Model(ct2)
    with pytest.raises(error, match=message):
        call(engine, held_out(small_config(False)))


def test_ctranslate2_max_len_1_is_the_bos_column_as_greedy_decode_gives(ct2, model):
    src = held_out(small_config(False))
    engine = ctranslate.CTranslate2Model(ct2)
    expected = greedy_decode(model, src, padding_mask(src, 0), max_len=1, bos_id=BOS, eos_id=EOS)
    assert torch.equal(engine.greedy(src, max_len=1), expected)
    assert torch.equal(engine.beam(src, max_len=1).tokens, expected)


@pytest.mark.parametrize("threads", [0, -2, 1.5])
def test_bad_thread_counts_are_refused_by_both_engines(ct2, ort, threads):
    with pytest.raises((TypeError, ValueError), match="threads"):
        ctranslate.CTranslate2Model(ct2, threads=threads)
    with pytest.raises((TypeError, ValueError), match="threads"):
        onnx_runtime.OnnxRuntimeModel(ort, threads=threads)


def test_nan_weights_are_not_exported_to_ctranslate2(model, tmp_path):
    broken = suite_model(model.config, {**weights(model.config)})
    with torch.no_grad():
        next(broken.parameters())[0, 0] = math.nan
    with pytest.raises(ValueError, match="holds NaN or inf"):
        ctranslate.export_ctranslate2(broken, tmp_path / "nan", bos_id=BOS, eos_id=EOS)
    assert not (tmp_path / "nan").exists()


def test_a_damaged_ctranslate2_model_names_its_file(ct2, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for path in ct2.iterdir():
        data = path.read_bytes()
        (damaged / path.name).write_bytes(data[: len(data) // 3] if path.name == "model.bin" else data)
    with pytest.raises(ValueError, match=r"damaged/model\.bin .*not a loadable CTranslate2 model"):
        ctranslate.CTranslate2Model(damaged)


def test_ctranslate2_runs_the_compute_type_asked_for(ct2):
    # int8 weights; CTranslate2 names the activations it keeps beside them ("int8_float32")
    assert ctranslate.CTranslate2Model(ct2, compute_type="int8").translator.compute_type.startswith("int8")
    assert ctranslate.CTranslate2Model(ct2).translator.compute_type == "float32"


# --- ONNX Runtime ---


def test_onnx_runtime_int8_runs_quantized_graphs_and_the_threads_asked_for(ort):
    engine = onnx_runtime.OnnxRuntimeModel(ort, precision="int8", threads=2)
    for name, session in engine.sessions.items():
        assert session.get_session_options().intra_op_num_threads == 2, name
    ops = {node.op_type for node in onnx.load(str(ort / "step.int8.onnx")).graph.node}
    plain = {node.op_type for node in onnx.load(str(ort / "step.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops and "MatMulInteger" not in plain
    float32 = onnx_runtime.OnnxRuntimeModel(ort, threads=1)
    assert float32.sessions["step"].get_session_options().intra_op_num_threads == 1
    src = held_out(small_config(False))
    mask = padding_mask(src, 0)
    bos = torch.full((len(src), 1), BOS)
    first = {name: e.project(e.decode_step(bos, e.start_cache(e.encode(src, mask), mask)))
             for name, e in (("int8", engine), ("float32", float32))}
    difference = (first["int8"] - first["float32"]).abs().max()
    assert 0 < difference < 0.5, difference  # quantised matrices: near the float32 run, not it


@pytest.mark.parametrize(("tgt", "error", "message"), [
    (torch.full((12, 1), 60), ValueError, r"tgt ids must lie in \[0, 60\)"),
    (torch.full((12, 1), -1), ValueError, r"tgt ids must lie in \[0, 60\)"),
    (torch.full((12, 1), 1.0), TypeError, "integer tensor"),
])
def test_onnx_runtime_checks_the_ids_of_a_step(ort, tgt, error, message):
    engine = onnx_runtime.OnnxRuntimeModel(ort)
    src = held_out(small_config(False))
    cache = engine.start_cache(engine.encode(src, padding_mask(src, 0)), padding_mask(src, 0))
    with pytest.raises(error, match=message):
        engine.decode_step(tgt, cache)
    assert cache.length == 0  # nothing ran


@pytest.mark.parametrize("hidden", [torch.zeros(2, 1, 31), torch.zeros(2, 1, 32, dtype=torch.float64),
                                    torch.zeros(2, 32), "hidden"])
def test_onnx_runtime_checks_the_hidden_states_it_projects(ort, hidden):
    with pytest.raises(ValueError, match=r"hidden must be a float32 \(B, T, D=32\) tensor"):
        onnx_runtime.OnnxRuntimeModel(ort).project(hidden)


def test_the_dynamo_exporter_without_onnxscript_names_the_extra(model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    with pytest.raises(ImportError, match=r'needs onnxscript: pip install -e "\.\[deploy\]"'):
        onnx_runtime.export_onnx(model, tmp_path)
    assert not any(tmp_path.iterdir())
