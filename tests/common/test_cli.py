"""common.cli: the one home of the command lines' device check and one-line errors."""

from __future__ import annotations

import argparse

import pytest
import torch

from common.cli import Parser, device_or_exit, error_line, first_line, one_line, positive


def test_first_line_skips_blank_lines_and_falls_back_to_the_type():
    assert first_line(ValueError("\n   \n  bad mask  \nmore detail")) == "bad mask"
    assert first_line(KeyError()) == "KeyError"


def test_error_line_is_type_and_first_line_or_the_type_alone():
    assert error_line(RuntimeError("size mismatch\n  at layer 3")) == "RuntimeError: size mismatch"
    assert error_line(ValueError()) == "ValueError"  # never "ValueError: ValueError"


def test_one_line_folds_a_heading_and_its_problems():
    error = ValueError("cannot import weights:\n  missing key a\n  key b: holds NaN or inf\n")
    assert one_line(error) == "cannot import weights: missing key a; key b: holds NaN or inf"
    assert one_line(RuntimeError()) == "RuntimeError"


@pytest.mark.parametrize("text", ["0", "-1", "inf", "nan", "-inf"])
def test_positive_refuses_zero_negative_and_non_finite(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be positive and finite"):
        positive(float)(text)


def test_a_bad_whole_number_is_only_called_not_positive():
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be positive, got '0'"):
        positive(int)("0")


def test_positive_reads_its_kind():
    assert positive(float)("0.25") == 0.25 and positive(int)("3") == 3


def test_a_usable_device_comes_back_as_a_device():
    assert device_or_exit(Parser(prog="prog"), "cpu") == torch.device("cpu")


@pytest.mark.parametrize(("name", "says"), [
    ("floppy", "--where floppy: "),
    ("meta", "--where meta: meta tensors hold no values"),
    pytest.param("cuda", "--where cuda: CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")),
])
def test_an_unusable_device_is_one_usage_line_naming_the_option(name, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        device_or_exit(Parser(prog="prog"), name, option="--where")
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"prog: error: {says}"), lines
