"""bfloat16 beside float32 in compare.py: the onednn row's bfloat16 twin, CTranslate2's bfloat16
compute types only where its build runs them, and the warning a table gets when the CPU only
emulates bfloat16 (native support mocked both ways); and the agreement study's rows (onednn
float32 and bfloat16, int8) against the float32 search."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks.compare.render import warning_lines
from benchmarks.engines import rows as engines
from benchmarks.engines.rows import EngineSettings, engine_rows
from benchmarks.studies import bfloat16_decoding
from benchmarks.studies.bfloat16_decoding import ROWS, SEARCHES, decode_split, runnable_rows
from common.random_batch import random_batch
from seq2seq.data.corpus import CorpusSettings, load_corpus
from seq2seq.fast.int8 import Int8Linear, int8_available
from seq2seq.fast.onednn import OneDnnLinear, packable_dtypes
from seq2seq.pipeline import evaluate, load_translation_model
from seq2seq.search.greedy import greedy_decode
from seq2seq.training.run import list_checkpoints
from tests.benchmarks.compare.test_busy_cores import STEADY, report_with
from tests.helpers import small_config
from tests.seq2seq.commands.test_translate import trained_run  # noqa: F401 (a fixture)
from variants import build

EMULATED = {"native": False, "reason": "no avx512_bf16 or amx_bf16 in /proc/cpuinfo"}
NATIVE = {"native": True, "reason": "avx512_bf16 in /proc/cpuinfo"}


def report(support: dict, dtype: str = "float32", rows: tuple[str, ...] = ("torch",)) -> dict:
    made = report_with({name: {"forward": STEADY} for name in rows})
    made["meta"]["bfloat16_cpu"] = support
    made["blocks"][0]["dtype"] = dtype
    return made


def emulated(lines: list[str]) -> list[str]:
    return [line for line in lines if "bfloat16 timed on a CPU without it" in line]


@pytest.mark.parametrize(("dtype", "rows"), [("bfloat16", ("torch",)),
                                             ("float32", ("torch", "onednn bfloat16"))])
def test_bfloat16_on_a_cpu_that_emulates_it_is_said_above_the_table(dtype, rows):
    (line,) = emulated(warning_lines(report(EMULATED, dtype, rows)))
    assert "no avx512_bf16 or amx_bf16" in line and "emulation's" in line
    assert emulated(warning_lines(report(NATIVE, dtype, rows))) == []


def test_a_float32_table_says_nothing_of_bfloat16_and_an_old_report_neither():
    assert emulated(warning_lines(report(EMULATED))) == []
    old = report(EMULATED, "bfloat16")
    del old["meta"]["bfloat16_cpu"]  # made before the field
    assert emulated(warning_lines(old)) == []


@pytest.mark.skipif(not torch.backends.mkldnn.is_available() or torch.bfloat16 not in packable_dtypes(),
                    reason="needs oneDNN with bfloat16 kernels (AVX-512)")
def test_the_onednn_row_has_a_bfloat16_twin_holding_the_same_weights(tmp_path):
    """Asked for onednn, the rows are float32 and bfloat16, each decoding the model's batch to
    its length; the float32 one gives the readable greedy search's tokens."""
    config = small_config(dropout=0.0)
    model = build("explicit", config, seed=0).eval()
    batch = random_batch(config, 3, 6, 5, seed=0)
    rows = engine_rows(model, batch, 6, tmp_path, EngineSettings(engines=("onednn",)))
    assert [row.label for row in rows] == ["onednn float32", "onednn bfloat16"]
    expected = greedy_decode(model, batch.src, batch.src_mask, max_len=6, bos_id=1,
                             eos_id=config.tgt_vocab_size - 1)
    float32, bfloat16 = (row.steps["decode"]() for row in rows)
    assert torch.equal(float32, expected) and bfloat16.shape[0] == 3 and bfloat16.shape[1] <= 6


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_ctranslate2_is_asked_only_for_compute_types_its_build_runs(monkeypatch, tmp_path):
    ctranslate = pytest.importorskip("seq2seq.deploy.ctranslate", reason="the deploy extra")
    monkeypatch.setattr(ctranslate, "supported_compute_types", lambda: frozenset({"float32", "int8"}))
    model = build("explicit", small_config(dropout=0.0), seed=0).eval()
    exported = ctranslate.export_ctranslate2(model, tmp_path / "ct2", bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match=r"'bfloat16': this CTranslate2 build runs float32, int8"):
        ctranslate.CTranslate2Model(exported, compute_type="bfloat16")
    batch = random_batch(model.config, 2, 5, 4, seed=0)
    rows = engine_rows(model, batch, 5, tmp_path / "rows",
                       EngineSettings(engines=("ctranslate2",), precisions=("float32", "bfloat16")))
    assert [row.label for row in rows] == ["ctranslate2 float32"]


def test_the_agreement_study_scores_each_row_against_the_float32_search(trained_run, sample_corpus):  # noqa: F811
    """A translation run's model file: the float32 search and every row this CPU runs (onednn
    float32, int8; onednn bfloat16 with AVX-512), greedy and beam 4 each; the float32 search's
    scores are the translate command's (``evaluate``), and it agrees with itself."""
    directory, _, _ = trained_run
    path = list_checkpoints(directory)[-1]
    results, run = decode_split(path)
    rows = (ROWS[0], *runnable_rows())
    assert "int8" in rows or not int8_available()
    assert [(r.row, r.search) for r in results] == [(row, search) for search in SEARCHES for row in rows]
    assert run["rows"] == list(rows)
    _, vocabulary, model, normalization = load_translation_model(path)
    expected = evaluate(model, vocabulary, load_corpus(CorpusSettings(str(sample_corpus.path))).test,
                        normalization=normalization)
    for result in results:
        assert 0.0 <= result.same_as_float32 <= 1.0 and result.seconds > 0
        if result.row == ROWS[0]:
            assert result.same_as_float32 == 1.0
            assert result.bleu == pytest.approx(expected[SEARCHES[result.search]].bleu)
    assert run["sentences"] == len(load_corpus(CorpusSettings(str(sample_corpus.path))).test)


def test_the_agreement_study_decodes_the_rows_asked_and_refuses_one_this_cpu_lacks(monkeypatch, capsys):
    """``--rows`` picks the rows beside the float32 search, by their names with dashes; a row this
    CPU cannot run is one line (exit 2) before the model is read."""
    asked = []

    def decode_split_asked(path, threads, rows):  # nothing decoded: the rows it was asked for
        asked.append(rows)
        return [], {"sentences": 0, "threads": 1, "bfloat16_reason": "not asked"}

    monkeypatch.setattr(bfloat16_decoding, "decode_split", decode_split_asked)
    monkeypatch.setattr(bfloat16_decoding, "packable_dtypes", lambda: (torch.float32,))
    assert bfloat16_decoding.main(["model.pt", "--rows", "int8", "onednn-float32", "int8"]) == 0
    assert asked == [("int8", "onednn float32")]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        bfloat16_decoding.main(["model.pt", "--rows", "onednn-bfloat16"])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--rows onednn-bfloat16: oneDNN has no bfloat16 kernels on this CPU" in line
    assert "onednn bfloat16" not in runnable_rows()
    with pytest.raises(ValueError, match=r"rows must be among .*, got \['float16'\]"):
        decode_split("model.pt", rows=("float16",))


@pytest.mark.skipif(not int8_available() or not torch.backends.mkldnn.is_available(),
                    reason="needs fbgemm (x86) and oneDNN")
def test_each_study_row_decodes_on_its_own_copy():
    """The int8 row's decoder steps on int8 linears, the onednn float32 row's on oneDNN's, never
    on the model itself."""
    model = build("fused", small_config(dropout=0.0), seed=0).eval()
    ids = dict(max_len=6, bos_id=1, eos_id=2)
    copies = {row: bfloat16_decoding.fast_decoder(model, row, 1, ids).next_token_logp.model
              for row in ("int8", "onednn float32")}
    assert isinstance(copies["int8"].generator, Int8Linear)
    assert isinstance(copies["onednn float32"].generator, OneDnnLinear)
    assert isinstance(model.generator, nn.Linear)


def test_without_onednn_bfloat16_kernels_the_onednn_row_is_float32_alone(monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "packable_dtypes", lambda: (torch.float32,))
    model = build("explicit", small_config(dropout=0.0), seed=0).eval()
    batch = random_batch(model.config, 2, 5, 4, seed=0)
    rows = engine_rows(model, batch, 5, tmp_path, EngineSettings(engines=("onednn",)))
    assert [row.label for row in rows] == ["onednn float32"]
