"""compare.py's fast-path rows, "inductor" (fused's static step compiled with inductor freezing)
and "onednn" (the same step eager on oneDNN linears): the reference's weights, decode-only rows,
the inductor row's compile time apart."""

from __future__ import annotations

import pytest
import torch

from benchmarks.compare.render import render
from benchmarks.compare.run import run
from benchmarks.engines.rows import EngineSettings, engine_rows
from common.random_batch import random_batch
from common.weights import transfer
from compare import parse_args
from seq2seq.data.ids import BOS_ID, timing_eos_id
from seq2seq.fast.onednn import packable_dtypes
from seq2seq.search.beam import beam_search
from seq2seq.search.greedy import greedy_decode
from tests.benchmarks.compare.test_compare import tiny_settings
from variants import build


def test_the_fast_path_rows_need_no_extra_and_join_like_engines():
    settings, _ = parse_args(["--preset", "tiny", "--variants", "fused", "inductor", "onednn",
                              "--decode-len", "4"])
    assert settings.engines == ("inductor", "onednn") and settings.variants == ("fused",)


@pytest.mark.parametrize("engine", [pytest.param("inductor", marks=pytest.mark.slow),  # compiles
                                    "onednn"])
def test_a_fast_path_row_decodes_the_reference_weights_tokens(engine, tmp_path):
    """Its steps hold the torch reference's weights in fused: the tokens and hypotheses of
    the eager decoders (growing cache) on fused with those weights."""
    settings = tiny_settings()
    reference = build("torch", settings.config, seed=3).eval()
    batch = random_batch(settings.config, 3, 6, 2)
    float32 = EngineSettings(engines=(engine,), precisions=("float32",))
    (row,) = engine_rows(reference, batch, 5, tmp_path, float32)
    assert (row.label, row.compiles) == (f"{engine} float32", engine == "inductor")
    fused = build("fused", settings.config)
    transfer(reference, fused)
    ids = dict(max_len=5, bos_id=BOS_ID, eos_id=timing_eos_id(settings.config))
    src, src_mask = batch.src, batch.src_mask
    assert torch.equal(row.steps["decode"](), greedy_decode(fused.eval(), src, src_mask, **ids))
    assert torch.equal(row.steps["beam"](), beam_search(fused, src, src_mask, **ids).tokens)


@pytest.mark.slow  # compiles and times
def test_the_inductor_row_reports_its_compile_time_beside_decode_cells():
    report = run(tiny_settings(variants=("torch",), engines=("inductor", "onednn"), decode_len=4,
                               all_decoders=True))
    rows = {row["variant"]: row for row in report["blocks"][0]["rows"]}
    # onednn's bfloat16 twin where oneDNN has bfloat16 kernels (AVX-512)
    twins = ["onednn bfloat16"] if torch.bfloat16 in packable_dtypes() else []
    assert list(rows) == ["torch", "inductor float32", "onednn float32", *twins]
    assert all(rows[name]["compile_s"] is None for name in ("onednn float32", *twins))
    inductor = rows["inductor float32"]
    assert inductor["decode_tokens_per_s"] > 0 and inductor["beam_tokens_per_s"] > 0
    assert inductor["compile_s"] > 0 and rows["torch"]["compile_s"] is None
    assert "forward_ms" not in inductor
    table = render(report, "github", wide=True).splitlines()

    def last_cell(line: str) -> str:  # the last column ("max |Δ logp|" holds bars of its own)
        return line.rstrip().rstrip("|").rsplit("|", 1)[1].strip()

    assert last_cell(next(line for line in table if line.startswith("| variant"))) == "compile s"
    cells = {line.split("|")[1].strip(): last_cell(line) for line in table
             if line.startswith(("| torch", "| inductor", "| onednn"))}
    assert {cells[name] for name in ("torch", "onednn float32", *twins)} == {"-"}
    assert float(cells["inductor float32"]) > 0
