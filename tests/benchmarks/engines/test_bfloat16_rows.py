"""bfloat16 beside float32 in compare.py: the onednn row's bfloat16 twin, CTranslate2's bfloat16
compute types only where its build runs them, and the warning a table gets when the CPU only
emulates bfloat16 (native support mocked both ways)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.compare.render import warning_lines
from benchmarks.engines import rows as engines
from benchmarks.engines.rows import EngineSettings, engine_rows
from benchmarks.studies.bfloat16_decoding import ROWS, SEARCHES, decode_split
from common.random_batch import random_batch
from seq2seq.data.corpus import CorpusSettings, load_corpus
from seq2seq.fast.onednn import packable_dtypes
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


@pytest.mark.skipif(not torch.backends.mkldnn.is_available() or torch.bfloat16 not in packable_dtypes(),
                    reason="needs oneDNN with bfloat16 kernels (AVX-512)")
def test_the_agreement_study_scores_each_row_against_the_float32_search(trained_run, sample_corpus):  # noqa: F811
    """A translation run's model file: six decodings (three rows, greedy and beam 4); the float32
    search's scores are the translate command's (``evaluate``), and it agrees with itself."""
    directory, _, _ = trained_run
    path = list_checkpoints(directory)[-1]
    results, run = decode_split(path)
    assert [(r.row, r.search) for r in results] == [(row, search) for search in SEARCHES for row in ROWS]
    _, vocabulary, model, normalization = load_translation_model(path)
    expected = evaluate(model, vocabulary, load_corpus(CorpusSettings(str(sample_corpus.path))).test,
                        normalization=normalization)
    for result in results:
        assert 0.0 <= result.same_as_float32 <= 1.0 and result.seconds > 0
        if result.row == ROWS[0]:
            assert result.same_as_float32 == 1.0
            assert result.bleu == pytest.approx(expected[SEARCHES[result.search]].bleu)
    assert run["sentences"] == len(load_corpus(CorpusSettings(str(sample_corpus.path))).test)


def test_without_onednn_bfloat16_kernels_the_onednn_row_is_float32_alone(monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "packable_dtypes", lambda: (torch.float32,))
    model = build("explicit", small_config(dropout=0.0), seed=0).eval()
    batch = random_batch(model.config, 2, 5, 4, seed=0)
    rows = engine_rows(model, batch, 5, tmp_path, EngineSettings(engines=("onednn",)))
    assert [row.label for row in rows] == ["onednn float32"]
