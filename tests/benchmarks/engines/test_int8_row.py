"""compare.py's "int8" row: fused's static step eager on int8 linears (``seq2seq.fast.int8``),
holding the reference's weights, as a decode-only row beside the engines; refused up front
where PyTorch has no fbgemm."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.compare.render import render
from benchmarks.compare.run import run
from benchmarks.engines import rows as engines
from benchmarks.engines.rows import EngineSettings, engine_rows
from common.masks import padding_mask
from common.random_batch import random_batch
from common.weights import transfer
from compare import parse_args
from seq2seq.data.ids import BOS_ID, timing_eos_id
from seq2seq.fast.flat import FlatDecoding
from seq2seq.fast.int8 import int8_available, with_int8_linears
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.benchmarks.compare.test_compare import tiny_settings
from variants import build

FBGEMM = pytest.mark.skipif(not int8_available(), reason="needs PyTorch's fbgemm quantized engine (x86)")


def test_the_int8_row_needs_no_extra_and_joins_like_engines():
    settings, _ = parse_args(["--preset", "tiny", "--variants", "fused", "onednn", "int8",
                              "--decode-len", "4", "--all-decoders"])
    assert settings.engines == ("onednn", "int8") and settings.variants == ("fused",)


@FBGEMM
def test_the_int8_row_decodes_the_reference_weights_on_int8_linears(tmp_path):
    """Its static decoders step on fused holding the torch reference's weights, its linears in
    int8: the tokens and hypotheses of the readable decoders (growing cache) on that copy; its
    label is its engine alone. Sources without padding: on a padded batch the row's flat encoder
    skips the padding, which then no longer counts in an int8 input's range, so the two would
    round differently by design."""
    settings = tiny_settings()
    reference = build("torch", settings.config, seed=3).eval()
    padded = random_batch(settings.config, 3, 6, 2)
    src = torch.randint(1, settings.config.src_vocab_size, (3, 6), generator=torch.Generator().manual_seed(0))
    src = src.masked_fill(src == settings.config.pad_id, 1)  # (B, S): no padding
    batch = dataclasses.replace(padded, src=src, src_mask=padding_mask(src, settings.config.pad_id))
    assert batch.src_mask.all()
    (row,) = engine_rows(reference, batch, 5, tmp_path, EngineSettings(engines=("int8",)))
    assert (row.label, row.precision, row.compiles) == ("int8", "int8", False)
    fused = build("fused", settings.config)
    transfer(reference, fused)
    quantized = with_int8_linears(fused.eval())
    ids = dict(max_len=5, bos_id=BOS_ID, eos_id=timing_eos_id(settings.config))
    src, src_mask = batch.src, batch.src_mask
    assert torch.equal(row.steps["decode"](), greedy_decode(quantized, src, src_mask, **ids))
    assert torch.equal(row.steps["beam"](), beam_search(quantized, src, src_mask, **ids).tokens)


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
@FBGEMM
def test_a_tiny_compare_run_times_the_int8_row_and_shows_it():
    report = run(tiny_settings(variants=("torch",), engines=("int8",), decode_len=4, all_decoders=True))
    rows = {row["variant"]: row for row in report["blocks"][0]["rows"]}
    assert list(rows) == ["torch", "int8"]
    assert rows["int8"]["decode_tokens_per_s"] > 0 and rows["int8"]["beam_tokens_per_s"] > 0
    assert "forward_ms" not in rows["int8"] and rows["int8"]["params"] is None
    assert any(line.startswith("| int8 ") for line in render(report, "github").splitlines())


def test_without_fbgemm_the_int8_row_is_refused_before_any_work(monkeypatch, capsys):
    monkeypatch.setattr(engines, "int8_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--preset", "tiny", "--variants", "fused", "int8", "--decode-len", "4"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "the int8 row runs PyTorch's fbgemm quantized engine" in line


@FBGEMM
@pytest.mark.parametrize("engine", ["onednn", "int8"])
def test_the_onednn_and_int8_rows_decode_on_the_flat_step(tmp_path, monkeypatch, engine):
    """Their greedy and beam decoders step through ``seq2seq.fast.flat.FlatDecoding``, the lever
    their rows are measured with (``FAST_PATHS``)."""
    steps = []
    step = FlatDecoding.static_step
    monkeypatch.setattr(FlatDecoding, "static_step", lambda self, *args: steps.append(1) or step(self, *args))
    settings = tiny_settings()
    reference = build("torch", settings.config, seed=3).eval()
    batch = random_batch(settings.config, 3, 6, 2)
    (row,) = engine_rows(reference, batch, 5, tmp_path,
                         EngineSettings(engines=(engine,), precisions=("float32", "int8")))
    for mode in ("decode", "beam"):
        steps.clear()
        row.steps[mode]()
        assert steps, mode
