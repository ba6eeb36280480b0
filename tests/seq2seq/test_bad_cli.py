"""Every command line checks its paths, numbers and devices before any work: a bad one is a
usage error (exit status 2) in one line naming the option; a file it cannot use is a runtime
error (exit status 1) in one line, not a traceback."""

from __future__ import annotations

import io
import re

import pytest

import compare
from common.config import TransformerConfig
from common.weights import export_weights
from seq2seq import average, decode, train
from seq2seq.training.checkpoint import ModelFile, save
from variants import build

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
USAGE_ERRORS = [  # (command line's parse_args, argv with {places}, what the one line must say)
    (train.parse_args, ["--lr-factor", "inf"], r"Recipe.lr_factor must be positive and finite, got inf"),
    (train.parse_args, ["--device", "meta"], r"--device meta: meta tensors hold no values"),
    (train.parse_args, ["--checkpoint-dir", "{under-file}"],
     rf"--checkpoint-dir .*/sub: .*/file {NOT_A_DIRECTORY}"),
    (train.parse_args, ["--checkpoint-dir", "{file}"], rf"--checkpoint-dir .*/file {NOT_A_DIRECTORY}"),
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
