"""The training command line (``python -m seq2seq.train``): it trains and reports, refuses bad
options in one line naming the setting's owner, refuses to resume from a checkpoint it cannot
continue (touching nothing), and of a translation run refuses options the task does not read,
a corpus or vocabulary it cannot use and another run's checkpoints, deleting nothing without
``--overwrite``; and no module imports a command-line module, so the command lines stay thin
shells over the library."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import re
from pathlib import Path

import pytest
import torch

from common.bfloat16 import Bfloat16Support
from seq2seq import decode, train
from seq2seq.data.corpus import CorpusSettings, load_corpus
from seq2seq.options import add_options, bf16_choice, settings_from_options
from seq2seq.storage.model_file import load_checkpoint
from seq2seq.train import main, parse_args
from seq2seq.training.run import checkpoint_path, list_checkpoints
from tests.seq2seq.commands.test_translate import TINY_MODEL, one_line_error
from tests.seq2seq.conftest import write_export
from tests.seq2seq.storage.test_checkpoint import DAMAGES, cli_options, files, run_cli

ROOT = Path(__file__).resolve().parents[3]
LIBRARY = ("common", "variants", "seq2seq", "benchmarks", "scripts")


def test_cli_trains_and_reports(capsys, monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    main(["--variant", "explicit", "--task", "reverse", "--steps", "3", "--batch", "4",
          "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "16", "--eval-size", "8"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("final loss ")
    assert out[1].startswith("held-out exact-sequence accuracy: ")
    assert "/8 reverse sequences" in out[1]
    bar = stderr.getvalue()
    assert "\r[" in bar and "step 3/3" in bar and "tok/s" in bar and bar.endswith("\n")
    assert "loss " in bar and " lr " in bar


@pytest.mark.parametrize("argv", [
    ["--variant", "nope"],
    ["--task", "sort"],
    ["--steps", "0"],
    ["--steps", "ten"],
    ["--lr-factor", "-1"],
    ["--dropout", "1.5"],
    ["--vocab", "3"],
    ["--min-len", "5", "--max-len", "4"],
    ["--d-model", "30", "--heads", "4"],
    ["--device", "floppy"],
    ["--resume"],  # needs --checkpoint-dir
    ["--save-every", "5"],
    ["--checkpoint-dir", "runs", "--save-every", "0"],
])
def test_bad_cli_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "named"), [
    (["--vocab", "3"], "vocab_size"),  # tasks.check_settings
    (["--batch", "0"], "batch_size"),
    (["--min-len", "5", "--max-len", "4"], "min_len"),
    (["--d-model", "30", "--heads", "4"], "d_model"),  # TransformerConfig
    (["--dropout", "1.5"], "dropout"),
    (["--layers", "0"], "n_layers"),
    (["--warmup", "0"], "warmup"),  # Recipe
    (["--lr-factor", "-1"], "lr_factor"),
    (["--label-smoothing", "1"], "label_smoothing"),
])
def test_the_owner_of_a_setting_names_it_in_one_line(argv, named, capsys):
    """The CLI repeats no range check: each value is refused by the code that owns it."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "error:" in err and named in err, err


@pytest.mark.parametrize(("parse", "required"), [(parse_args, []), (decode.parse_args, ["--model", "x.pt"])],
                         ids=["train", "decode"])
def test_a_device_torch_does_not_know_is_a_usage_error_naming_the_option(parse, required, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse([*required, "--device", "floppy"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "error: --device floppy: " in err, err


def test_the_options_become_frozen_settings_and_a_bad_one_a_value_error():
    """``seq2seq.options`` is a library: it neither exits nor changes the parsed options; the
    command prints its ValueError as the usage error."""
    parser = argparse.ArgumentParser()
    add_options(parser)
    args = parser.parse_args(["--steps", "5", "--d-model", "32"])
    given = dict(vars(args))
    settings = settings_from_options(args)
    assert vars(args) == given and args.heads is None  # not filled in place
    assert settings.run.steps == 5 and settings.config.d_model == 32 and settings.config.n_heads == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.task = "copy"
    with pytest.raises(ValueError, match=r"^Recipe.lr_factor must be positive and finite, got inf$"):
        settings_from_options(parser.parse_args(["--lr-factor", "inf"]))


# --- resuming -------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["corrupt", "mismatch", "done"])
def test_cli_refuses_to_resume_and_touches_nothing(reason, tmp_path, capsys, monkeypatch):
    run_cli(train, cli_options(tmp_path, "--steps", "2"), capsys, monkeypatch)
    extra = ["--d-ff", "24"] if reason == "mismatch" else []
    if reason == "corrupt":
        DAMAGES["truncated"](checkpoint_path(tmp_path, 2), None)
    before = files(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        steps = "2" if reason == "done" else "4"  # "done": the run is at its --steps already
        train.main(cli_options(tmp_path, "--steps", steps, "--resume", *extra))
    message = str(exit_info.value.code)
    assert message.startswith("python -m seq2seq.train: error: cannot resume from ")
    named = {"corrupt": "truncated or corrupt", "mismatch": "config.d_ff: checkpoint 16, this run 24",
             "done": "it is at step 2; ask for more --steps to continue"}[reason]
    assert named in message
    assert files(tmp_path) == before


def test_resume_from_a_missing_or_empty_folder_is_refused_and_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "typo" / "run"
    err = one_line_error(capsys, lambda: train.main(cli_options(missing, "--steps", "2", "--resume")))
    assert f"--checkpoint-dir {missing}: no such directory" in err and "--resume" in err, err
    assert not (tmp_path / "typo").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    err = one_line_error(capsys, lambda: train.main(cli_options(empty, "--steps", "2", "--resume")))
    assert f"--checkpoint-dir {empty} holds no checkpoint (step-*.pt)" in err, err
    assert list(empty.iterdir()) == []



# --- translation runs ---------------------------------------------------------------------

SMALL_TASK = ["--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "16", "--batch", "8",
              "--threads", "1", "--eval-size", "8"]


def test_a_vocabulary_the_corpus_cannot_fill_is_one_line(sample_corpus, capsys):
    err = one_line_error(capsys, lambda: train.main(
        ["--task", "translate", "--data", str(sample_corpus.path), "--vocab", "4000", "--steps", "1"]),
        code=1)
    assert "cannot train a bpe vocabulary of 4000 pieces" in err and "--vocab" in err


@pytest.mark.parametrize(("argv", "said"), [
    (["--task", "translate", "--data", "{corpus}", "--max-len", "5"], "--max-len is for the synthetic tasks"),
    (["--task", "translate", "--data", "{corpus}", "--batch", "5"], "--batch is for the synthetic tasks"),
    (["--task", "translate", "--data", "{corpus}", "--eval-size", "5"], "--eval-size is for the synthetic"),
    (["--task", "reverse", "--batch-tokens", "100"], "--batch-tokens is for --task translate"),
    (["--task", "copy", "--preset", "gpu"], "--preset is for --task translate"),
    (["--task", "copy", "--minutes", "1"], "--minutes is for --task translate"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints must be at least 0"),
    (["--overwrite"], "need --checkpoint-dir"),
])
def test_an_option_the_task_does_not_read_is_refused(sample_corpus, capsys, argv, said):
    argv = [arg.format(corpus=sample_corpus.path) for arg in argv]
    err = one_line_error(capsys, lambda: train.parse_args(argv))
    assert said in err, err


def test_a_fresh_run_refuses_a_directory_of_another_runs_checkpoints(tmp_path, capsys):
    directory = tmp_path / "run"
    directory.mkdir()
    earlier = checkpoint_path(directory, 7)
    earlier.write_bytes(b"another run's checkpoint")
    for task in (["--task", "translate", "--data", str(earlier)], []):
        argv = [*task, "--checkpoint-dir", str(directory)]
        err = one_line_error(capsys, lambda argv=argv: train.parse_args(argv))
        assert "holds 1 checkpoints of an earlier run (newest step-00000007.pt)" in err
        assert "--overwrite" in err
    assert earlier.read_bytes() == b"another run's checkpoint"
    err = one_line_error(capsys, lambda: train.parse_args(
        ["--checkpoint-dir", str(directory), "--resume", "--overwrite"]))
    assert "give one of them" in err
    train.main(["--steps", "2", *SMALL_TASK, "--checkpoint-dir", str(directory), "--overwrite"])
    assert [path.name for path in list_checkpoints(directory)] == ["step-00000002.pt"]
    assert load_checkpoint(checkpoint_path(directory, 2)).step == 2


def long_pairs_export(sample_corpus, path):
    """The sample corpus with every French sentence repeated to more than 256 words: each pair
    longer than the preset's max_seq_len of 256 positions (a word is one piece at least)."""
    pairs = [(english, " ".join([french] * (256 // len(french.split()) + 1)))
             for english, french in sample_corpus.pairs]
    return write_export(path, pairs)


@pytest.mark.parametrize(("problem", "said"), [
    ("a bad corpus line", "line 3: expected 2 or 3 tab-separated columns"),
    ("a vocabulary the corpus cannot fill", "cannot train a bpe vocabulary of 4000 pieces"),
    ("every pair too long", "longer than max_seq_len=256"),
])
def test_overwrite_deletes_nothing_when_the_run_cannot_start(sample_corpus, tmp_path, capsys, problem, said):
    """``--overwrite`` deletes the earlier run's checkpoints only once the corpus, the vocabulary
    and the settings are known good, just before the first checkpoint is written."""
    directory = tmp_path / "run"
    directory.mkdir()
    for step in (3, 4):
        checkpoint_path(directory, step).write_bytes(f"the earlier run's step {step}".encode())
    before = {path.name: path.read_bytes() for path in directory.iterdir()}
    corpus, vocab = sample_corpus.path, "120"
    if problem == "a bad corpus line":
        corpus = tmp_path / "fra.txt"
        lines = sample_corpus.path.read_text(encoding="utf-8").splitlines()
        corpus.write_text("\n".join([*lines[:2], "one column only", *lines[2:]]) + "\n", encoding="utf-8")
    elif problem == "a vocabulary the corpus cannot fill":
        vocab = "4000"
    else:
        corpus = long_pairs_export(sample_corpus, tmp_path / "fra.txt")
    err = one_line_error(capsys, lambda: train.main(
        ["--task", "translate", "--data", str(corpus), *TINY_MODEL, "--vocab", vocab, "--steps", "1",
         "--checkpoint-dir", str(directory), "--overwrite"]), code=1)
    assert said in err, err
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == before


def test_a_corpus_whose_every_pair_is_too_long_is_named(sample_corpus, tmp_path, capsys):
    corpus = long_pairs_export(sample_corpus, tmp_path / "fra.txt")
    train_pairs = len(load_corpus(CorpusSettings(str(corpus))).pairs("train"))
    err = one_line_error(capsys, lambda: train.main(
        ["--task", "translate", "--data", str(corpus), *TINY_MODEL, "--steps", "1"]), code=1)
    assert f"all {train_pairs} train pairs are longer than max_seq_len=256" in err, err


def test_a_translation_run_refuses_to_resume_from_a_task_runs_checkpoint(sample_corpus, tmp_path, capsys):
    """Its model's ids mean the checkpoint's subword pieces: a checkpoint without them is refused."""
    train.main(["--steps", "1", *SMALL_TASK, "--checkpoint-dir", str(tmp_path)])
    capsys.readouterr()
    err = one_line_error(capsys, lambda: train.main(
        ["--task", "translate", "--data", str(sample_corpus.path), *TINY_MODEL, "--steps", "2",
         "--checkpoint-dir", str(tmp_path), "--resume"]), code=1)
    assert "cannot resume from " in err and "step-00000001.pt: it holds no subword vocabulary" in err, err


@pytest.mark.parametrize(("keep", "left"), [(2, [5, 6]), (None, [2, 3, 4, 5, 6]), (0, [1, 2, 3, 4, 5, 6])])
def test_only_the_newest_checkpoints_are_kept(tmp_path, capsys, keep, left):
    keep_option = [] if keep is None else ["--keep-checkpoints", str(keep)]
    train.main(["--steps", "6", *SMALL_TASK, "--checkpoint-dir", str(tmp_path), "--save-every", "1",
                *keep_option])
    assert list_checkpoints(tmp_path) == [checkpoint_path(tmp_path, step) for step in left]


def test_a_translation_longer_than_the_model_is_left_out_of_training(sample_corpus, tmp_path, capsys):
    long_french = "la maison " * 150  # 300 words: more pieces than the preset's 256 positions
    path = tmp_path / "fra.txt"
    text = sample_corpus.path.read_text(encoding="utf-8")
    path.write_text(text + "".join(f"The cat sees the house {n}.\t{long_french}\n" for n in range(8)),
                    encoding="utf-8")
    train.main(["--task", "translate", "--data", str(path), *TINY_MODEL, "--steps", "1", "--eval-every", "1"])
    captured = capsys.readouterr()
    assert re.search(r"^\d+ train or valid pairs longer than max_seq_len 256 left out", captured.err, re.M)
    assert captured.out.startswith("final loss ")



# --- bfloat16 by default where the CPU has it ----------------------------------------------

NATIVE = Bfloat16Support(True, "avx512_bf16 in /proc/cpuinfo")
EMULATED = Bfloat16Support(False, "no avx512_bf16 or amx_bf16 in /proc/cpuinfo: bfloat16 is emulated")


@pytest.mark.parametrize(("support", "options", "on", "said"), [
    (NATIVE, [], True, "avx512_bf16 in /proc/cpuinfo"),
    (EMULATED, [], False, "bfloat16 is emulated"),
    (NATIVE, ["--no-bf16"], False, "--no-bf16"),
    (EMULATED, ["--bf16"], True, "--bf16"),
])
def test_translation_trains_in_bfloat16_where_the_cpu_multiplies_it_natively(
        monkeypatch, sample_corpus, support, options, on, said):
    monkeypatch.setattr("seq2seq.options.bfloat16_support", lambda device="cpu": support)
    settings = parse_args(["--task", "translate", "--data", str(sample_corpus.path), *options])
    assert settings.bf16 is on and settings.run.bf16_reason.endswith(said)


def test_the_synthetic_tasks_and_other_devices_keep_float32_unless_asked(monkeypatch):
    monkeypatch.setattr("seq2seq.options.bfloat16_support", lambda device="cpu": NATIVE)
    assert not parse_args([]).bf16 and parse_args(["--bf16"]).bf16
    off_the_cpu = bf16_choice(None, True, torch.device("cuda"))
    assert off_the_cpu[0] is False and "--bf16" in off_the_cpu[1]


def test_the_first_line_says_the_precision_and_why(monkeypatch, sample_corpus, capsys):
    monkeypatch.setattr("seq2seq.options.bfloat16_support", lambda device="cpu": NATIVE)
    train.main(["--task", "translate", "--data", str(sample_corpus.path), *TINY_MODEL, "--steps", "1"])
    first = capsys.readouterr().err.splitlines()[0]
    assert first.endswith("parameters on cpu, bfloat16 autocast (avx512_bf16 in /proc/cpuinfo)"), first
    train.main(["--steps", "1", *SMALL_TASK])
    assert capsys.readouterr().err.splitlines()[0].endswith("parameters on cpu, float32")


# --- the library imports no command line ---------------------------------------------------


def command_line_modules() -> set[str]:
    """The seq2seq modules that run as programs (``python -m seq2seq.NAME``)."""
    return {f"seq2seq.{path.stem}" for path in (ROOT / "seq2seq").glob("*.py")
            if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")}


def imported_modules(path: Path) -> set[str]:
    """Every dotted name an import in ``path`` may refer to: ``from a import b`` gives a and a.b."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_module_imports_a_command_line_module():
    """A command line's helpers are its own: what two commands share lives in the library
    (``seq2seq.evaluation``, ``common.cli``), never in another command's module."""
    commands = command_line_modules()
    assert {"seq2seq.train", "seq2seq.decode", "seq2seq.average"} <= commands
    paths = [path for package in LIBRARY for path in (ROOT / package).rglob("*.py")]
    offenders = sorted(f"{path.relative_to(ROOT)} imports {name}"
                       for path in [*paths, ROOT / "compare.py"]
                       for name in imported_modules(path) & commands)
    assert not offenders, offenders
