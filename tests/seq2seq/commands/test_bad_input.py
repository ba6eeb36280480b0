"""Every command line checks its paths, numbers and devices before any work: a bad one is a
usage error (exit status 2) in one line naming the option; a file it cannot use is a runtime
error (exit status 1) in one line, not a traceback. In process (each command's ``parse_args``
and ``main``), and in a fresh interpreter per command (no command line prints a traceback for
bad input; slow).

The bad-input tests of the commands live in this folder: here what every command shares, in
test_train.py and test_translate.py what one command refuses."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import compare
from common.config import TransformerConfig
from common.weights import export_weights
from seq2seq import average, decode, train
from seq2seq.storage.model_file import ModelFile, save
from seq2seq.training.run import checkpoint_path
from tests.seq2seq.commands.test_translate import one_line_error
from tests.seq2seq.storage.test_checkpoint import files, saved_run
from variants import build

ROOT = Path(__file__).resolve().parents[3]
CONFIG = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=16, dropout=0.0,
                           src_vocab_size=9, tgt_vocab_size=9, max_seq_len=8)
DATA = dict(task="copy", batch_size=4, vocab_size=9, min_len=1, max_len=5, seed=0)


@pytest.fixture
def places(tmp_path) -> dict[str, str]:
    """A regular file, a path under it, and a directory."""
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "dir").mkdir()
    return {"file": str(tmp_path / "file"), "under-file": str(tmp_path / "file" / "sub"),
            "dir": str(tmp_path / "dir")}


NOT_A_DIRECTORY = "is a file, not a directory"
AVERAGE = ["--checkpoint-dir", "{dir}", "--output"]
SEED_RANGE = r"argument --seed: must be a seed in 0\.\.4294967295 \(2\*\*32 - 1\), got"  # common.cli.seed_int
USAGE_ERRORS = [  # (command line's parse_args, argv with {places}, what the one line must say)
    (train.parse_args, ["--lr-factor", "inf"], r"Recipe.lr_factor must be positive and finite, got inf"),
    (train.parse_args, ["--device", "meta"], r"--device meta: meta tensors hold no values"),
    (train.parse_args, ["--checkpoint-dir", "{under-file}"],
     rf"--checkpoint-dir .*/sub: .*/file {NOT_A_DIRECTORY}"),
    (train.parse_args, ["--checkpoint-dir", "{file}"], rf"--checkpoint-dir .*/file {NOT_A_DIRECTORY}"),
    (train.parse_args, ["--seed", "-1"], rf"{SEED_RANGE} -1 "),
    (train.parse_args, ["--seed", "4294967296"], rf"{SEED_RANGE} 4294967296 "),
    (decode.parse_args, ["--model", "x.pt", "--device", "meta"], r"--device meta: meta tensors hold no"),
    (average.parse_args, [*AVERAGE, "{dir}"], r"--output .*/dir is a directory"),
    (average.parse_args, [*AVERAGE, "{under-file}/a.pt"],
     rf"--output .*/sub/a\.pt: .*/file {NOT_A_DIRECTORY}"),
    (compare.parse_args, ["--output", "{dir}"], r"--output '.*/dir' is a directory"),
    (compare.parse_args, ["--output", "{under-file}"], rf"--output '.*/sub': '.*/file' {NOT_A_DIRECTORY}"),
    (compare.parse_args, ["--min-run-time", "inf"],
     r"--min-run-time: must be positive and finite, got 'inf'"),
]


@pytest.mark.parametrize(("parse", "argv", "named"), USAGE_ERRORS,
                         ids=[f"{p.__module__}-{'-'.join(a)}" for p, a, _ in USAGE_ERRORS])
def test_a_bad_option_is_a_one_line_usage_error(parse, argv, named, places, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse([arg.format(**places) for arg in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert len(err.splitlines()) == 1, err
    assert re.search(named, err), err


def model_file(tmp_path, name: str, variant: str = "explicit", nan: bool = False) -> str:
    weights = export_weights(build("explicit", CONFIG, seed=0))
    if nan:
        weights["decoder.norm.bias"][1] = float("nan")
    record = ModelFile(variant=variant, config=CONFIG, settings={"data": DATA}, weights=weights)
    return str(save(record, tmp_path / name))


@pytest.mark.parametrize(("kind", "named"), [
    ("nan", r"cannot build explicit from .*nan\.pt: cannot import weights: key decoder\.norm\.bias: "
            r"holds NaN or inf"),
    ("outside", r"cannot build no_such_package\.model:Transformer from .*outside\.pt: .*no_such_package"),
])
def test_decode_reports_a_model_it_cannot_build_in_one_line(kind, named, tmp_path, monkeypatch):
    path = model_file(tmp_path, f"{kind}.pt", nan=kind == "nan",
                      variant="no_such_package.model:Transformer" if kind == "outside" else "explicit")
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with pytest.raises(SystemExit) as exit_info:
        decode.main(["--model", path, "--eval-size", "4"])
    message = str(exit_info.value.code)
    assert message.startswith("python -m seq2seq.decode: error: ")
    assert "\n" not in message
    assert re.search(named, message), message


@pytest.mark.parametrize("name", [
    "step-00000001.pt",  # older than the run's checkpoints
    "step-00000002.pt",  # an older one of them
    "step-00000003.pt",  # the newest
    "step-00000009.pt",  # newer than the newest
    "step-4.pt",  # the pattern's digits, unpadded
    "elsewhere/step-00000005.pt",  # another folder: a run may write there too
])
def test_average_refuses_to_write_a_training_checkpoints_name(name, tmp_path, capsys):
    """A model file under a checkpoint's name would be the newest (or an) checkpoint a later
    --resume reads, and it holds no optimiser state: refused before anything is read or made."""
    directory = tmp_path / "run"
    saved_run(directory, steps=(2, 3))
    before = files(tmp_path)
    output = directory / name
    err = one_line_error(capsys, lambda: average.main(
        ["--checkpoint-dir", str(directory), "--last", "2", "--output", str(output)]))
    assert f"--output {output}: " in err and "training checkpoint" in err, err
    assert files(tmp_path) == before and not (directory / "elsewhere").exists()


# --- in a fresh interpreter: no traceback ---------------------------------------------------

MARK = "=== run "

# Runs each argv in turn, as ``python -m MODULE ARGV`` (or ``python SCRIPT ARGV``) would, and
# says how each ended. An exception other than SystemExit is not caught: it ends the interpreter
# with a traceback, as it would end the command.
DRIVER = f"""
import runpy, sys, json
for argv in json.loads(sys.argv[1]):
    print({MARK!r} + " ".join(argv), file=sys.stderr, flush=True)
    sys.argv = list(argv)
    try:
        if argv[0].endswith(".py"):
            runpy.run_path(argv[0], run_name="__main__")
        else:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code
        if isinstance(code, str):  # what the interpreter does with sys.exit("message")
            print(code, file=sys.stderr)
            code = 1
    print("exit", code, flush=True)
"""


def bad_runs(tmp_path: Path) -> dict[str, list[list[str]]]:
    """Per command line, its bad invocations."""
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "empty").mkdir()
    weights = export_weights(build("explicit", CONFIG, seed=0))
    weights["decoder.norm.bias"][1] = float("nan")
    nan_model = save(ModelFile("explicit", CONFIG, {"data": DATA}, weights), tmp_path / "nan.pt")
    save(ModelFile("explicit", CONFIG, {"data": DATA}, weights), checkpoint_path(tmp_path / "nan-run", 1))
    outside = save(ModelFile("no_such_package.model:Transformer", CONFIG, {"data": DATA},
                             export_weights(build("explicit", CONFIG, seed=0))), tmp_path / "outside.pt")
    noise = tmp_path / "noise.pt"
    noise.write_bytes(bytes(range(256)) * 4)
    under_file = str(tmp_path / "file" / "sub")
    # small and short, so that a bad option let through would end (with status 0), not run on
    train = ["seq2seq.train", "--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "16",
             "--steps", "2", "--eval-size", "4"]
    return {
        "train": [[*train, "--lr-factor", "inf"], [*train, "--device", "meta"],
                  [*train, "--checkpoint-dir", under_file], [*train, "--steps", "0"],
                  [*train, "--resume", "--checkpoint-dir", str(tmp_path / "empty")]],
        "decode": [["seq2seq.decode", "--model", str(path)] for path in (nan_model, outside, noise)]
                  + [["seq2seq.decode", "--model", str(tmp_path / "missing.pt")],
                     ["seq2seq.decode", "--model", str(nan_model), "--device", "meta"]],
        "average": [["seq2seq.average", "--checkpoint-dir", str(tmp_path), "--output", str(tmp_path)],
                    ["seq2seq.average", "--checkpoint-dir", str(tmp_path), "--output", under_file],
                    ["seq2seq.average", "--checkpoint-dir", str(tmp_path / "nan-run"), "--last", "1",
                     "--output", str(tmp_path / "average.pt")]],
        "compare": [["compare.py", *options] for options in (
            ["--output", str(tmp_path)], ["--output", under_file], ["--min-run-time", "inf"],
            ["--rounds", "0"])],
    }


@pytest.mark.slow
def test_no_command_line_prints_a_traceback(tmp_path):
    runs = bad_runs(tmp_path)
    started = {name: subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(argvs)], cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, argvs in runs.items()}  # side by side: most of each is importing torch
    try:
        ended = {name: process.communicate(timeout=180) for name, process in started.items()}
    finally:
        for process in started.values():
            process.kill()  # only those still running, after a timeout
            process.wait()
    for name, (stdout, stderr) in ended.items():
        assert "Traceback" not in stderr, stderr
        codes = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("exit ")]
        said = stderr.split(MARK)[1:]
        assert len(codes) == len(said) == len(runs[name]), (name, stdout, stderr)
        for code, text in zip(codes, said, strict=True):
            command, *lines = [line for line in text.splitlines() if line.strip()]
            assert code in (1, 2), (command, code, lines)
            assert len(lines) == 1 and "error:" in lines[0], (command, lines)
    assert torch.isnan(weights_of(tmp_path / "nan.pt")).any()  # the bad file was really bad


def weights_of(path: Path) -> torch.Tensor:
    return torch.load(path, weights_only=True)["weights"]["decoder.norm.bias"]
