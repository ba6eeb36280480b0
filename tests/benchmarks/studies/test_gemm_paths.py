"""benchmarks.studies.gemm_paths: a row per linear shape and product path, each path the same product as
F.linear to float32 rounding, and MKL's report of its code path."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks.studies import gemm_paths


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
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


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
@pytest.mark.skipif(not torch._C.has_mkl, reason="an MKL build of torch")
def test_mkl_reports_its_code_path():
    assert gemm_paths.mkl_code_path().startswith("MKL_VERBOSE oneMKL")


def test_a_batch_past_the_bound_is_refused_before_any_work(capsys, monkeypatch):
    """--batch 10000000 would ask the allocator for terabytes (the generator's output alone is
    batch x 37000 floats): refused in one line naming the bound, before MKL's probe or a timing."""
    monkeypatch.setattr(gemm_paths, "mkl_code_path", lambda: pytest.fail("worked first"))
    monkeypatch.setattr(gemm_paths, "time_paths", lambda *a: pytest.fail("worked first"))
    for batch in ("10000000", str(gemm_paths.MAX_BATCH + 1)):
        with pytest.raises(SystemExit) as stop:
            gemm_paths.main(["--batch", batch])
        assert stop.value.code == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert f"--batch must be at most {gemm_paths.MAX_BATCH}" in line and f"got {batch}" in line, line
    assert gemm_paths.MAX_BATCH == 1024
