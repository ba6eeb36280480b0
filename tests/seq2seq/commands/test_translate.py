"""The translation command lines: ``python -m seq2seq.train --task translate`` and
``python -m seq2seq.translate``; bad options in one line, a run end to end on the tests' own
sample corpus, and a model file that translates in a fresh process."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.config import TransformerConfig
from common.weights import export_weights
from seq2seq import average, pipeline, train, translate
from seq2seq.data.corpus import CorpusSettings, load_corpus
from seq2seq.data.subwords import Vocabulary
from seq2seq.storage.model_file import ModelFile, load, save
from seq2seq.training.recipe import StepReport
from seq2seq.training.run import list_checkpoints, progress_bar
from variants import build

ROOT = Path(__file__).resolve().parents[3]
TINY_MODEL = ["--vocab", "120", "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "32",
              "--dropout", "0", "--batch-tokens", "300", "--warmup", "5", "--threads", "1"]


def one_line_error(capsys, call, code=2) -> str:
    with pytest.raises(SystemExit) as exit_info:
        call()
    err = exit_info.value.code if isinstance(exit_info.value.code, str) else capsys.readouterr().err
    if exit_info.value.code != code and not isinstance(exit_info.value.code, str):
        raise AssertionError(f"exit status {exit_info.value.code}, expected {code}: {err}")
    assert len(err.strip().splitlines()) == 1 and "error:" in err, err
    return err


@pytest.mark.parametrize(("argv", "said"), [
    (["--task", "translate"], "--task translate needs --data PATH"),
    (["--task", "translate", "--data", "{corpus}", "--max-words", "0"], "--max-words: must be positive"),
    (["--task", "translate", "--data", "{corpus}", "--max-words", "eight"],
     "--max-words: expected a positive int"),
    (["--task", "translate", "--data", "nowhere.zip"], "--data nowhere.zip: no such file"),
    (["--task", "reverse", "--data", "{corpus}"], "--data is for --task translate"),
    (["--task", "translate", "--data", "{corpus}", "--vocab", "4"], "VocabularySettings.size must exceed 4"),
    (["--task", "translate", "--data", "{corpus}", "--minutes", "0"], "--minutes: must be positive"),
    (["--task", "translate", "--data", "{corpus}", "--d-model", "30"], "d_model (30) must be divisible"),
])
def test_bad_translate_options_fail_in_one_line(sample_corpus, capsys, argv, said):
    argv = [arg.format(corpus=sample_corpus.path) for arg in argv]
    err = one_line_error(capsys, lambda: train.parse_args(argv))
    assert said in err, err


def test_the_preset_gives_the_defaults_and_options_override_it(sample_corpus):
    args = train.parse_args(["--task", "translate", "--data", str(sample_corpus.path), "--d-ff", "64"])
    assert args.translation == pipeline.TRAINING_PRESETS["cpu"].replace(d_ff=64)
    assert args.config.share_embeddings and args.config.d_ff == 64
    assert args.corpus == CorpusSettings(str(sample_corpus.path), max_words=8)
    gpu = train.parse_args(["--task", "translate", "--data", str(sample_corpus.path), "--preset", "gpu"])
    assert gpu.translation == pipeline.TRAINING_PRESETS["gpu"]
    plain = train.parse_args([])  # the synthetic task keeps its own defaults
    assert plain.d_model == 64 and not plain.share_embeddings and plain.steps == 300


def test_the_command_parses_once_and_builds_the_translation_config_once(sample_corpus, monkeypatch):
    """One parse fills every option not given from the preset, and the model's config is built
    once, from the settings, with the requested vocabulary size on both sides."""
    built, parses = [], []
    real, real_parse = pipeline.TransformerConfig, argparse.ArgumentParser.parse_known_args
    monkeypatch.setattr(pipeline, "TransformerConfig",
                        lambda **fields: built.append(fields) or real(**fields))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args",  # what parse_args calls
                        lambda self, *a, **k: parses.append(a) or real_parse(self, *a, **k))
    args = train.parse_args(["--task", "translate", "--data", str(sample_corpus.path), "--vocab", "120"])
    assert len(parses) == 1 and len(built) == 1, (parses, built)
    assert args.config == real(**built[0]) and args.config.src_vocab_size == args.config.tgt_vocab_size == 120
    assert args.config.d_model == pipeline.TRAINING_PRESETS["cpu"].d_model  # the preset's, not the tasks' 64


def test_translate_refuses_a_missing_file_and_a_model_without_vocabulary(tmp_path, capsys):
    err = one_line_error(capsys, lambda: translate.main([str(tmp_path / "none.pt"), "Hi."]), code=1)
    assert "no checkpoint or model file" in err
    config = TransformerConfig(d_model=8, n_heads=2, n_layers=1, d_ff=8, src_vocab_size=5,
                               tgt_vocab_size=5, max_seq_len=8)
    path = save(ModelFile("explicit", config, {}, export_weights(build("explicit", config, seed=0))),
                tmp_path / "copy.pt")
    err = one_line_error(capsys, lambda: translate.main([str(path), "Hi."]), code=1)
    assert "holds no subword vocabulary" in err
    err = one_line_error(capsys, lambda: translate.parse_args([str(path), "--beam", "0"]))
    assert "--beam" in err


def test_sentences_may_follow_the_options():
    args = translate.parse_args(["model.pt", "--beam", "1", "Stop!", "Wait!"])
    assert args.beam == 1 and args.sentences == ["Stop!", "Wait!"]


@pytest.fixture(scope="module")
def trained_run(sample_corpus, tmp_path_factory):
    """A 4-step translate run on the sample corpus, checkpoints every 2 steps; its stdout."""
    directory = tmp_path_factory.mktemp("run")
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdout", out)
        patch.setattr("sys.stderr", err)
        train.main(["--task", "translate", "--data", str(sample_corpus.path), *TINY_MODEL, "--steps", "4",
                    "--eval-every", "4", "--checkpoint-dir", str(directory), "--save-every", "2"])
    return directory, out.getvalue(), err.getvalue()


def test_a_translate_run_reports_bleu_and_writes_self_contained_checkpoints(trained_run, sample_corpus):
    directory, out, err = trained_run
    lines = out.splitlines()
    assert lines[0].startswith("final loss ") and "4 steps" in lines[0]
    assert "www.manythings.org/anki and tatoeba.org" in lines[1]
    test = load_corpus(CorpusSettings(str(sample_corpus.path))).test
    assert f"test split: {len(test)} English sentences of at most 8 words, " \
           f"{sum(len(e.references) for e in test)} French references" in lines[1]
    assert lines[2].startswith("greedy   BLEU ") and lines[3].startswith("beam 4   BLEU ")
    assert lines[4].startswith("BLEU signature: nrefs:") and "tok:13a" in lines[4]
    assert lines[5].startswith("chrF signature: ")
    # "step 4 (0.0 min): valid loss ...": every --eval-every steps, with the training minutes
    assert re.search(r"step 4 \(\d+\.\d min\): valid loss ", err)
    assert "greedy BLEU" in err and "step 2 (" not in err
    paths = list_checkpoints(directory)
    assert [path.name for path in paths] == ["step-00000002.pt", "step-00000004.pt"]
    record = load(paths[-1])
    assert Vocabulary.from_tensor(record.vocabulary).size == 120 == record.config.tgt_vocab_size
    assert record.settings["data"]["corpus"]["path"] == str(sample_corpus.path)


def test_averaging_keeps_the_vocabulary_and_translate_reads_it(trained_run, capsys):
    directory, _, _ = trained_run
    averaged = directory / "average.pt"
    average.main(["--checkpoint-dir", str(directory), "--last", "2", "--output", str(averaged)])
    assert torch.equal(load(averaged).vocabulary, load(list_checkpoints(directory)[-1]).vocabulary)
    capsys.readouterr()
    translate.main([str(averaged), "The cat sees the sea.", "Help!", "--beam", "2"])
    assert len(capsys.readouterr().out.splitlines()) == 2


@pytest.mark.slow
def test_resuming_continues_with_the_checkpoints_vocabulary(trained_run, sample_corpus, capsys):
    directory, _, _ = trained_run
    train.main(["--task", "translate", "--data", str(sample_corpus.path), *TINY_MODEL, "--steps", "5",
                "--eval-every", "100", "--checkpoint-dir", str(directory), "--resume"])
    assert "5 steps" in capsys.readouterr().out.splitlines()[0]
    assert torch.equal(load(list_checkpoints(directory)[-1]).vocabulary,
                       load(list_checkpoints(directory)[0]).vocabulary)
    err = one_line_error(capsys, lambda: train.main(
        ["--task", "translate", "--data", str(sample_corpus.path), *TINY_MODEL, "--d-ff", "16",
         "--steps", "6", "--checkpoint-dir", str(directory), "--resume"]), code=1)
    assert "config.d_ff: checkpoint 32, this run 16" in err


@pytest.mark.slow
def test_a_model_file_translates_in_a_fresh_process_without_the_corpus(trained_run, tmp_path):
    """A fresh interpreter, another directory, stdin: the file alone is enough."""
    directory, _, _ = trained_run
    model = list_checkpoints(directory)[-1]
    result = subprocess.run([sys.executable, "-m", "seq2seq.translate", str(model), "--beam", "1"],
                            input="The dog likes the sea.\nRun!\n", capture_output=True, text=True,
                            cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2


def test_translate_scores_a_model_on_its_test_split(trained_run, tmp_path, capsys):
    directory, out, _ = trained_run
    model = str(list_checkpoints(directory)[-1])
    translate.main([model, "--score"])
    lines = capsys.readouterr().out.splitlines()
    assert "www.manythings.org/anki and tatoeba.org" in lines[0]
    assert lines[1:] == out.splitlines()[2:]  # the scores the run printed for the same weights
    missing = str(tmp_path / "x.zip")
    err = one_line_error(capsys, lambda: translate.main([model, "--score", "--data", missing]), code=1)
    assert "x.zip: no such file" in err


def test_a_run_with_a_time_budget_counts_its_steps_against_the_minutes(capsys):
    """A translation preset's step count only bounds the run (its minutes end it): the bar must
    not promise 100,000 steps and a day of remaining time."""
    report = StepReport(step=1, steps=100_000, loss=1.0, lr=1e-3, tokens=10, seconds=1.0)
    with progress_bar(100_000, minutes=30, file=sys.stderr) as show:
        show(report)
    budget = capsys.readouterr().err
    with progress_bar(100_000, file=sys.stderr) as show:
        show(report)
    steps = capsys.readouterr().err
    assert "of 30 min" in budget and "100000" not in budget
    assert "1/100000" in steps


@pytest.fixture
def loaded_stub(monkeypatch):
    """translate's model loading replaced: the lines it would translate are recorded."""
    said = []
    model = pipeline.TranslationModel(ModelFile.__new__(ModelFile), None, torch.nn.Identity(), "NFKC")
    object.__setattr__(model.record, "banned_ids", ())
    monkeypatch.setattr(translate, "load_translation_model", lambda path, variant: model)
    monkeypatch.setattr(translate, "translate_sentences",
                        lambda model, vocabulary, sentences, **k: said.extend(sentences) or list(sentences))
    return said


def test_standard_input_that_is_not_utf8_is_one_line(loaded_stub, monkeypatch, capsys):
    before = b"Run!\nle caf"  # the bytes before the first that is not UTF-8
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(before + b"\xe9\n")))
    with pytest.raises(SystemExit) as stop:
        translate.main(["model.pt", "--beam", "1"])
    assert stop.value.code == ("python -m seq2seq.translate: error: standard input: is not UTF-8 text "
                               f"(byte 0xe9 at offset {len(before)})")
    assert loaded_stub == []


@pytest.mark.parametrize(("data", "lines"), [
    (b"a\nb\n", ["a", "b"]), (b"a\r\nb", ["a", "b"]), (b"a\rb\r\n\n", ["a", "b", ""]), (b"", []),
    ("caf\u00e9\n".encode(), ["caf\u00e9"]),
])
def test_standard_input_lines_end_in_lf_crlf_or_cr(loaded_stub, monkeypatch, capsys, data, lines):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    translate.main(["model.pt", "--beam", "1"])
    assert loaded_stub == lines


def test_the_first_line_says_the_minutes_bound_training_and_scoring_follows():
    assert pipeline.budget_words(None) == ""
    assert pipeline.budget_words(1.0).startswith(" (at most 1 minute of training; the test split's scoring")
    assert "at most 30 minutes of training" in pipeline.budget_words(30)
    assert "at most 0.5 minutes" in pipeline.budget_words(0.5)


def test_the_test_split_is_scored_under_a_bar_of_its_own(monkeypatch):
    """Greedy, then beam 4, each a phase the bar names; the scores are evaluate's."""
    asked = []
    monkeypatch.setattr(pipeline, "evaluate", lambda model, vocabulary, examples, beam_sizes, normalization:
                        asked.append(beam_sizes) or {beam_sizes[0]: f"scores of {beam_sizes[0]}"})
    stream = io.StringIO()
    examples = ["a", "b", "c"]
    scores = pipeline.score_test_split(None, None, examples, "NFKC", stream)
    assert scores == {1: "scores of 1", 4: "scores of 4"} and asked == [(1,), (4,)]
    shown = stream.getvalue()
    assert "scoring the test split, greedy" in shown and "scoring the test split, beam 4" in shown
    assert pipeline.score_test_split(None, None, examples, "NFKC", None) == scores  # no bar, same scores
