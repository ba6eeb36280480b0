"""Hugging Face's MarianMTModel as a compare.py row ("hf-marian"): the reference's weights, its
forward and its generate timed beside the rows, refused where it cannot compute the config's
function or transformers is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from benchmarks.compare.run import run
from benchmarks.compare.workload import TIMING_PRESETS
from benchmarks.engines.rows import hf_marian_steps, missing_extra
from common.config import TransformerConfig
from common.random_batch import random_batch
from compare import parse_args
from seq2seq.search.greedy import greedy_decode
from tests.benchmarks.compare.test_compare import tiny_settings
from variants import REFERENCE, build

pytest.importorskip("transformers", reason="the hf extra (pip install -e '.[hf]')")

# the tiny preset in Marian's shape: what MarianMTModel computes exactly
MARIAN_TINY = TransformerConfig(**TIMING_PRESETS["tiny"].fields, activation="silu", final_norm=False,
                                positions="marian", norm_eps=1e-5, dropout=0.0)


def test_the_opus_mt_base_preset_is_hugging_face_s_shape():
    settings, _ = parse_args(["--preset", "opus-mt-base", "--variants", "torch", "hf-marian"])
    assert settings.engines == ("hf-marian",) and settings.variants == ("torch",)
    config = settings.config
    assert (config.d_model, config.n_heads, config.n_layers, config.d_ff) == (512, 8, 6, 2048)
    assert (config.src_vocab_size, config.share_embeddings, config.activation) == (58101, True, "silu")
    assert (config.final_norm, config.positions, config.norm_eps) == (False, "marian", 1e-5)


def test_a_config_marian_cannot_compute_is_refused_by_its_fields(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--preset", "tiny", "--variants", "torch", "hf-marian"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "the hf-marian row: Hugging Face's MarianMTModel needs final_norm=False" in line
    assert ("this config has final_norm=True, positions='paper', norm_eps=1e-06 "
            "(e.g. --preset opus-mt-base)") in line


def test_a_missing_hf_extra_is_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "transformers" else real(name, *args))
    assert missing_extra(("hf-marian",)) == 'the hf-marian rows need transformers: pip install -e ".[hf]"'


def test_the_row_computes_the_reference_s_function_and_decodes_its_tokens():
    """Forward log-probs as torch's (float32: Hugging Face's positions are its own float32
    table); greedy generate's ids as the suite's greedy decoding of the same weights."""
    torch.manual_seed(0)
    reference = build(REFERENCE, MARIAN_TINY, seed=0).eval()
    batch = random_batch(MARIAN_TINY, 3, 9, 7, seed=0)
    steps = hf_marian_steps(reference, batch, max_len=6)
    with torch.no_grad():
        expected = reference(*batch.inputs())
    torch.testing.assert_close(steps["forward"](), expected)
    tokens = greedy_decode(reference, batch.src, batch.src_mask, max_len=6, bos_id=1,
                           eos_id=MARIAN_TINY.tgt_vocab_size - 1)
    assert torch.equal(steps["decode"](), tokens)
    assert steps["beam"]().shape[0] == 3


@pytest.mark.slow  # seconds: a child process, a compile or a full run; CI runs it with -m slow
def test_the_row_is_timed_beside_torch_forward_and_decoding():
    report = run(tiny_settings(config=MARIAN_TINY, variants=("torch",), engines=("hf-marian",),
                               decode_len=4))
    rows = {row["variant"]: row for row in report["blocks"][0]["rows"]}
    assert list(rows) == ["torch", "hf-marian float32"]
    row = rows["hf-marian float32"]
    assert row["forward_ms"] > 0 and row["decode_tokens_per_s"] > 0 and row["params"] is None
