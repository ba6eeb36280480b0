"""Deployment engines as compare.py rows: decode cells only, timed beside torch, refused where
they cannot run."""

from __future__ import annotations

import importlib.util
import statistics

import pytest
import torch
from torch import nn
from tqdm import tqdm

from benchmarks.compare.measured import Row
from benchmarks.compare.render import render
from benchmarks.compare.report import block_result, meta, row_result
from benchmarks.compare.run import CONTROL, Block, build_engine_rows, run
from benchmarks.compare.settings import Settings
from benchmarks.compare.steps import autocast_region
from benchmarks.compare.timing import Peak
from benchmarks.compare.workload import TIMING_PRESETS, Shape
from benchmarks.engines import rows as engines
from benchmarks.engines.rows import missing_extra, row_argument
from common.config import TransformerConfig
from common.random_batch import random_batch
from compare import parse_args
from seq2seq.deploy import onnx_runtime
from tests.benchmarks.compare.test_busy_cores import timed_cell
from tests.benchmarks.compare.test_compare import tiny_settings
from variants import REFERENCE, VARIANTS, build

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
    # the wide table keeps one row per variant and engine (the compact one puts the engine rows
    # in a decode-only table of their own: test_the_compact_table_with_engine_rows_fits_120_characters)
    line = next(line.split("|") for line in render(report, "github", wide=True).splitlines()
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


# --- the path compare.py takes to an engine row ------------------------------------------------


def test_compare_builds_each_engine_row_with_its_precision_and_threads(monkeypatch, tmp_path):
    """compare.py's options -> Settings -> build_engine_rows, as run_block calls it: each row's
    engine is made with the row's precision and the run's threads, CTranslate2's in a process of
    its own. CTranslate2 runs for real (its export is quick), its Translator watched (here, so
    built in this process); ONNX Runtime's export and sessions are
    stood in for (its export takes a minute), the reference decoding in their place."""
    settings, _ = parse_args(["--preset", "tiny", "--variants", "torch", "onnxruntime", "ctranslate2",
                              "--decode-len", "4", "--threads", "3", "--batch", "2", "--src-len", "6"])
    made = []
    real_translator = ctranslate2.Translator

    def translator(*args, **options):
        made.append(("ctranslate2", options["compute_type"], options["intra_threads"]))
        return real_translator(*args, **options)

    reference = build(REFERENCE, settings.config, seed=settings.seed).eval()

    def onnx_model(directory, *, precision="float32", threads=1):
        made.append(("onnxruntime", precision, threads))
        return reference

    def in_this_process(factory, *args, **kwargs):  # where the watched Translator is
        made.append(("own process", factory.__name__))
        return factory(*args, **kwargs)

    monkeypatch.setattr(ctranslate2, "Translator", translator)
    monkeypatch.setattr(engines, "Isolated", in_this_process)
    monkeypatch.setattr(onnx_runtime, "export_onnx", lambda model, directory, **_: directory)
    monkeypatch.setattr(onnx_runtime, "quantize_int8", lambda directory: made.append(("quantized",)))
    monkeypatch.setattr(onnx_runtime, "OnnxRuntimeModel", onnx_model)
    shape = settings.shapes[0]
    block = Block("cpu", "float32", shape, random_batch(settings.config, *shape, seed=settings.seed),
                  autocast_region("cpu", torch.float32, False))
    rows = build_engine_rows(settings, block, Row(REFERENCE, reference), str(tmp_path), tqdm(disable=True))
    assert [row.variant for row in rows] == ["onnxruntime float32", "onnxruntime int8",
                                             "ctranslate2 float32", "ctranslate2 int8"]
    assert made == [("quantized",), ("onnxruntime", "float32", 3), ("onnxruntime", "int8", 3),
                    ("own process", "CTranslate2Model"), ("ctranslate2", "float32", 3),
                    ("own process", "CTranslate2Model"), ("ctranslate2", "int8", 3)]
    assert all(not cell.error for row in rows for cell in row.cells.values())


# --- the compact table with engine rows -----------------------------------------------------------

BASE = TransformerConfig(**TIMING_PRESETS["base"].fields)
IDS_PER_CALL = 8 * 15  # batch 8, 16 ids a row counting BOS


def base_report_with_engine_rows() -> dict:
    """A base-preset block as a run with every variant, the control and four engine rows leaves
    it (rounds made up, at the base model's times on a 2-core CPU; nothing timed)."""
    settings = Settings(config=BASE, shapes=(Shape(8, 128, 128),), preset="base", decode_len=16,
                        threads=2, engines=("onnxruntime", "ctranslate2"), show_progress=False)
    noisy = [1.0, 1.07, 0.94, 1.02, 0.97]
    rows = []
    for index, name in enumerate((*VARIANTS, CONTROL)):
        cells = {"forward": timed_cell([1.8173 * (1 + 0.01 * index) * r for r in noisy]),
                 "train": timed_cell([5578.0e-3 * r for r in noisy]),
                 "decode": timed_cell([IDS_PER_CALL / 258.0 * r for r in noisy])}
        row = Row(name, nn.Linear(2, 2), cells=cells, max_abs_dlogp=1.9e-6,
                  peak_mb={"forward": 900.0, "train": 1483.0}, decode_positions={"decode": IDS_PER_CALL})
        rows.append(row)
    rows[VARIANTS.index(REFERENCE)].fast_path = True
    for label, rate in (("onnxruntime float32", 238.0), ("onnxruntime int8", 311.0),
                        ("ctranslate2 float32", 523.0), ("ctranslate2 int8", 1485.0)):
        rows.append(Row(label, None, cells={"decode": timed_cell([IDS_PER_CALL / rate * r for r in noisy])},
                        decode_positions={"decode": IDS_PER_CALL}))
    peak = Peak(150e9, 5e9, (150e9,), (1024, 512, 512), {(1024, 512, 512): 150e9})
    results = [row_result(row, settings, Shape(8, 128, 128), peak.flops_per_second) for row in rows]
    control = next(result for result in results if result["variant"] == CONTROL)
    block = block_result("cpu", "float32", Shape(8, 128, 128), peak,
                         [result for result in results if result is not control], control=control,
                         float32_matmul_precision="IEEE float32",
                         rounds={"orders": [[row.variant for row in rows]] * 5, "seed": 0,
                                 "others": [0.0] * 5, "contended": [False] * 5})
    return {"meta": meta(settings, "glibc default"), "blocks": [block]}


def test_the_compact_table_with_engine_rows_fits_120_characters():
    """Every line of the default table, engine rows included, and each engine row still shows
    its decoding rate (ids per call over its median call)."""
    text = render(base_report_with_engine_rows(), "github")
    assert max(map(len, text.splitlines())) <= 120, text
    for label, rate in (("onnxruntime float32", 238.0), ("ctranslate2 int8", 1485.0)):
        line = next(line for line in text.splitlines() if line.startswith(f"| {label} "))
        median = statistics.median([IDS_PER_CALL / rate * r for r in [1.0, 1.07, 0.94, 1.02, 0.97]])
        assert f" {IDS_PER_CALL / median:,.0f} " in line, line
