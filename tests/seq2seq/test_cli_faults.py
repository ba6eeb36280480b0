"""No command line prints a traceback for bad input: each runs its bad options in a fresh
interpreter, and every run ends in exit status 2 (usage) or 1 (a file it cannot use) with one
line on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.config import TransformerConfig
from common.weights import export_weights
from seq2seq.training.checkpoint import ModelFile, save
from seq2seq.training.run import checkpoint_path
from variants import build

ROOT = Path(__file__).resolve().parents[2]
CONFIG = TransformerConfig(d_model=16, n_heads=2, n_layers=1, d_ff=16, dropout=0.0,
                           src_vocab_size=9, tgt_vocab_size=9, max_seq_len=8)
DATA = dict(task="copy", batch_size=4, vocab_size=9, min_len=1, max_len=5, seed=0)
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
