"""Deployment engines as compare.py rows: decode cells only, timed beside torch, refused where
they cannot run."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks.engines import missing_extra, row_argument
from benchmarks.render import render
from benchmarks.run import Block, build_engine_rows, run
from compare import parse_args
from tests.benchmarks.test_compare import tiny_settings

ctranslate2 = pytest.importorskip("ctranslate2", reason="the deploy extra (pip install -e '.[deploy]')")


@pytest.mark.slow  # exports and times CTranslate2 (about 4 s)
def test_engine_rows_time_decoding_beside_torch_and_nothing_else():
    """CTranslate2 exports fast (no torch.onnx), so it stands for both engines here."""
    report = run(tiny_settings(variants=("torch",), engines=("ctranslate2",), decode_len=4,
                               all_decoders=True))
    rows = {row["variant"]: row for row in report["blocks"][0]["rows"]}
    assert list(rows) == ["torch", "ctranslate2 float32", "ctranslate2 int8"]
    for label in ("ctranslate2 float32", "ctranslate2 int8"):
        row = rows[label]
        assert row["decode_tokens_per_s"] > 0 and row["beam_tokens_per_s"] > 0
        # per generated id against torch's: the two rates' ratio, inverted
        assert row["decode_vs_torch"] == pytest.approx(
            rows["torch"]["decode_tokens_per_s"] / row["decode_tokens_per_s"])
        assert "forward_ms" not in row and "decode_uncached_tokens_per_s" not in row
        assert row["params"] is None and row["max_abs_dlogp"] is None
    line = next(line.split("|") for line in render(report, "github").splitlines()
                if line.startswith("| ctranslate2 float32"))
    assert [cell.strip() for cell in line[2:4]] == ["-", "-"]  # params, fwd ms: not measured


@pytest.mark.parametrize(("device", "dtype_name", "autocast"),
                         [("cpu", "bfloat16", False), ("cuda", "float32", False), ("cpu", "float32", True)])
def test_engine_rows_join_only_cpu_float32_blocks(device, dtype_name, autocast):
    """Decided before anything is exported (nothing else of the block is touched)."""
    settings = tiny_settings(engines=("ctranslate2",), decode_len=4, autocast=autocast)
    block = Block(device, dtype_name, settings.shapes[0], batch=None, autocast=None)
    assert build_engine_rows(settings, block, reference=None, directory="unused", bar=None) == []


def test_compare_splits_engines_from_variants():
    settings, _ = parse_args(["--preset", "tiny", "--variants", "fused", "ctranslate2", "onnxruntime"])
    assert settings.engines == ("ctranslate2", "onnxruntime")
    assert settings.variants == ("fused",)
    assert parse_args(["--preset", "tiny"])[0].engines == ()
    assert row_argument("onnxruntime") == "onnxruntime" and row_argument("explicit") == "explicit"


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--variants", "ctranslate2", "--decode-len", "1"], "--decode-len above 1"),
        (["--variants", "tensorrt"], "tensorrt"),
        # no block the engine rows could join: a table with no rows at all
        (["--variants", "onnxruntime", "--dtype", "bfloat16"], "CPU float32 blocks only"),
        (["--variants", "ctranslate2", "--autocast"], "CPU float32 blocks only"),
        (["--variants", "fused", "ctranslate2", "--dtype", "float16", "bfloat16"], "CPU float32 blocks only"),
    ],
)
def test_bad_engine_options_exit_2_with_one_line(options, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", *options])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert named in line


def test_a_missing_deploy_extra_is_named_before_any_timing(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "onnxruntime" else real(name, *args))
    assert missing_extra(("ctranslate2",)) is None
    assert "onnxruntime" in missing_extra(("onnxruntime",)) and "[deploy]" in missing_extra(("onnxruntime",))
    with pytest.raises(SystemExit):
        parse_args(["--preset", "tiny", "--variants", "onnxruntime"])
    assert 'pip install -e ".[deploy]"' in capsys.readouterr().err
