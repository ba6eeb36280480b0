"""scripts.gemm_paths: a row per linear shape and product path, each path the same product as
F.linear to float32 rounding, and MKL's report of its code path."""

from __future__ import annotations

import re

import pytest
import torch

from scripts import gemm_paths


def test_every_path_computes_the_same_product(capsys, monkeypatch):
    monkeypatch.setattr(gemm_paths, "SHAPES", ((64, 96), (96, 64)))
    assert gemm_paths.main(["--batch", "3", "--threads", "1", "--min-run-time", "0.01"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+ -> \d+) +\| (.+?) +\|.*\| ([0-9.e+-]+) +\|$", out, flags=re.M)
    paths = ["F.linear"] + (["MKL packed"] if torch._C.has_mkl else []) + (
        ["oneDNN packed"] if torch.backends.mkldnn.is_available() else [])
    shapes = ("64 -> 96", "96 -> 64")
    assert [(shape, path) for shape, path, _ in rows] == [(s, p) for s in shapes for p in paths]
    assert all(float(diff) < 1e-4 for *_, diff in rows)  # unit-scale products: float32 rounding
    assert "batch 3, float32" in out


@pytest.mark.skipif(not torch._C.has_mkl, reason="an MKL build of torch")
def test_mkl_reports_its_code_path():
    assert gemm_paths.mkl_code_path().startswith("MKL_VERBOSE oneMKL")
