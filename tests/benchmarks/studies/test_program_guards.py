"""The measuring programs refuse settings they cannot run before any work (one line, exit 2, or
exit 1 with the reason), and the learners table compares every row with the first row, not the
one before."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.studies import bfloat16_decoding, decode_scan, static_decode
from benchmarks.studies.learners import __main__ as learners
from benchmarks.studies.learners import study as learners_study
from benchmarks.studies.learners.study import Learning, markdown_report, prepare, run_learners
from seq2seq.data.corpus import Example
from tests.benchmarks.studies.learners.test_study import TINY, settings_for

SMALL = ["--vocab", "120", "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32"]


def test_learners_with_batches_too_small_for_a_pair_stop_before_training(sample_corpus, tmp_path,
                                                                        monkeypatch):
    monkeypatch.setattr(learners_study, "train_learner", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(ValueError, match="batch_tokens 10 cannot hold the longest pair"):
        prepare(settings_for(sample_corpus, translation=TINY.replace(batch_tokens=10)))
    with pytest.raises(SystemExit) as stop:
        learners.main(["--data", str(sample_corpus.path), "--out", str(tmp_path), *SMALL,
                       "--batch-tokens", "10"])
    assert "error: batch_tokens 10 cannot hold the longest pair" in str(stop.value.code)
    assert "\n" not in str(stop.value.code)


def test_the_learners_table_compares_every_row_with_the_first(sample_corpus, monkeypatch):
    """Three rows: the third matches the first on 3 of 4 sentences and the second on 1 of 4; its
    column says 75.0%, what it shares with the first row."""
    said = {"explicit": ("a b", "c d", "e f", "g h"),
            "fused": ("a b", "x", "y", "g h"),
            "torch": ("a b", "c d", "e f", "z")}
    monkeypatch.setattr(learners_study, "train_learner",
                        lambda variant, *a, **k: (variant, Learning(variant, (1.0,), (1.0,), 10)))
    monkeypatch.setattr(learners_study, "translate_sentences", lambda model, *a, **k: list(said[model]))
    monkeypatch.setattr(learners_study, "validation_loss", lambda *a, **k: 0.0)
    test = tuple(Example(f"s{i}", (text,)) for i, text in enumerate(said["explicit"]))
    settings = settings_for(sample_corpus, variants=("explicit", "fused", "torch"))
    result = run_learners(settings, SimpleNamespace(test=test, vocabulary=None, valid=None))
    assert [row.identical for row in result.rows] == [{1: 1.0, 4: 1.0}, {1: 0.5, 4: 0.5}, {1: 0.75, 4: 0.75}]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in markdown_report(result).splitlines()
             if line.startswith("| ") and "variant" not in line}
    assert cells["torch"][-2:] == ["75.0%", "75.0%"] and cells["fused"][-2:] == ["50.0%", "50.0%"]


def test_a_source_longer_than_the_preset_reads_is_refused_first(capsys, monkeypatch):
    monkeypatch.setattr(decode_scan, "settle_threads", lambda *a: pytest.fail("measured first"))
    with pytest.raises(SystemExit) as stop:
        decode_scan.main(["--preset", "tiny", "--src-len", "129", "--max-len", "3"])
    assert stop.value.code == 2
    assert "--src-len must be at most the preset's max_seq_len=128, got 129" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        static_decode.parse(["--device", "cpu", "--preset", "tiny", "--src-len", "129", "--max-len", "3"])
    assert stop.value.code == 2
    assert "--src-len must be at most the preset's max_seq_len=128, got 129" in capsys.readouterr().err


def test_a_study_of_one_row_is_refused_before_training(sample_corpus, tmp_path, monkeypatch, capsys):
    """The statistic compares rows: one row has nothing to compare, so the study stops up front
    instead of after its training."""
    monkeypatch.setattr(learners_study, "train_learner", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(SystemExit) as stop:
        learners.main(["--data", str(sample_corpus.path), "--out", str(tmp_path), *SMALL,
                       "--steps", "2", "--seeds", "0", "1", "--variants", "explicit"])
    assert stop.value.code == 2
    assert "give --variants at least two, got explicit" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["a folder", "under a file", "the model"])
def test_the_bfloat16_study_checks_its_output_before_the_six_decodes(tmp_path, capsys, monkeypatch, where):
    """An output it cannot write was found after all six decodes, as a traceback: now one line
    before any decode."""
    model = tmp_path / "model.pt"
    model.write_bytes(b"not read: the output is checked first")
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    output = {"a folder": tmp_path / "folder", "under a file": tmp_path / "file" / "out.json",
              "the model": model}[where]
    monkeypatch.setattr(bfloat16_decoding, "decode_split", lambda *a: pytest.fail("decoded first"))
    with pytest.raises(SystemExit) as stop:
        bfloat16_decoding.main([str(model), "--output", str(output)])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"python -m benchmarks.studies.bfloat16_decoding: error: --output {output}")
