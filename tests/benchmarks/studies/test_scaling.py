"""The scaling study's arithmetic: the exponent fit and its interval, the crossing of a share,
the peak memory predicted from the shapes (against the profiler on a tiny model), the memory
wall; and its command's refusals before any work."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import torch

from benchmarks.compare.measured import Cell
from benchmarks.compare.memory import profile_step
from benchmarks.compare.steps import forward_backward, forward_step
from benchmarks.studies.scaling import __main__ as scaling
from benchmarks.studies.scaling.analysis import (
    crossing,
    fit_exponent,
    memory_wall,
    predicted_peak,
    score_bytes,
    top_octaves,
)
from benchmarks.studies.scaling.sweep import PHASES, ScalingSettings, SizeResult
from common.config import TransformerConfig
from common.random_batch import random_batch
from variants import VARIANTS, build

# quadratic-heavy on purpose: 2 heads over 8 model dims make the (B, H, S, S) tensors most of a step
TINY = TransformerConfig(d_model=8, n_heads=2, n_layers=1, d_ff=16, src_vocab_size=20, tgt_vocab_size=20,
                         max_seq_len=128)


def test_the_fit_recovers_a_known_exponent_and_its_interval_holds_it():
    rng = np.random.default_rng(0)
    sizes = np.repeat([256, 512, 1024], 6)
    seconds = 2e-3 * (sizes / 256) ** 1.7 * np.exp(rng.normal(0, 0.05, sizes.size))  # 5% noise
    fit = fit_exponent(sizes, seconds)
    assert abs(fit.k - 1.7) < 0.1  # the slope's standard error here is about 0.02
    assert fit.low < fit.k < fit.high and fit.points == 18 and fit.sizes == (256, 512, 1024)
    # a 95% interval holds the true exponent in about 95 of 100 draws: at least 90 of 200 is
    # three binomial standard deviations (1.5%) below 95%, never reached by chance
    held = sum(fit_exponent(sizes, 2e-3 * (sizes / 256) ** 1.7 * np.exp(draw.normal(0, 0.05, sizes.size)))
               .holds(1.7) for draw in (np.random.default_rng(seed) for seed in range(1, 201)))
    assert held >= 180
    # without noise, two sizes: the slope is log(t2 / t1) / log(S2 / S1), by hand 3 for t = S^3
    exact = fit_exponent([100, 200], [1e-3, 8e-3])
    assert exact.k == pytest.approx(math.log(8) / math.log(2)) and exact.low is None


def test_the_fit_refuses_what_it_cannot_fit():
    assert fit_exponent([64, 64], [1.0, 1.1]) is None  # one size
    assert fit_exponent([64, 128], [1.0, 0.0]) is None  # a failed cell
    with pytest.raises(ValueError, match="pair up"):
        fit_exponent([64, 128], [1.0])


def test_the_top_octaves_are_those_within_reach_of_the_largest():
    assert top_octaves([32, 64, 128, 256, 512, 1024, 2048], 2) == [512, 1024, 2048]
    assert top_octaves([32, 64], 5) == [32, 64]


def test_the_attention_share_crossing_is_interpolated_in_log_size():
    # 0.4 at 200, 0.6 at 400: half-way in log size, 200 * sqrt(2)
    assert crossing([100, 200, 400], [0.2, 0.4, 0.6]) == pytest.approx(200 * math.sqrt(2))
    assert crossing([400, 100, 200], [0.6, 0.2, 0.4]) == pytest.approx(200 * math.sqrt(2))  # any order
    assert crossing([100, 200], [0.55, 0.7]) == 100  # already past half at the smallest
    assert crossing([100, 200], [0.1, 0.3]) is None


def test_one_score_tensor_is_exactly_the_allocation_the_profiler_records():
    """explicit's forward materialises Q K^T: its bmm allocates B x H x S x S floats, and
    fused's SDPA allocates nothing that large."""
    batch = random_batch(TINY, 2, 64, 64, seed=0)
    expected = 2 * TINY.n_heads * 64 * 64 * 4  # B H S S float32, by hand: 131,072 bytes
    assert score_bytes(TINY, 2, 64) == expected
    for name, sizes in (("explicit", {expected}), ("fused", set())):
        model = build(name, TINY, seed=0).eval()
        with torch.profiler.profile(profile_memory=True) as profiled:
            forward_step(model, batch)()
        big = {e.self_cpu_memory_usage for e in profiled.events() if e.self_cpu_memory_usage >= expected}
        assert big == sizes, name


@pytest.mark.parametrize("phase", ["forward", "train"])
@pytest.mark.parametrize("name", ["explicit", "mathfirst"])
def test_the_predicted_peak_matches_the_profiler_within_its_approximate_part(name, phase):
    """The scores and masks are counted from the code; the per-token activations and the
    generator only by a rule of thumb. So the prediction may miss by at most those parts,
    which at this shape are under a fifth of it: the quadratic part alone must be right."""
    model = build(name, TINY, seed=0).train(phase == "train")
    batch = random_batch(TINY, 1, 128, 128, seed=0)
    step = forward_backward(model, batch) if phase == "train" else forward_step(model, batch)
    measured, _ = profile_step("cpu", step)
    predicted = predicted_peak(TINY, name, phase, 1, 128)
    approximate = predicted.tokens + predicted.vocab
    assert approximate < 0.2 * predicted.total
    assert predicted.activations > predicted.gradients  # at this length the activations' stage is the peak
    assert abs(predicted.total - predicted.weights - measured) <= approximate


@pytest.mark.parametrize("name", ["explicit", "fused"])
def test_a_short_train_steps_peak_is_its_gradients(name):
    """At a few tokens the activations are small, and the train step's peak is its end: a
    gradient per parameter, counted here from the built model, not from the prediction's sums."""
    config = TransformerConfig(d_model=32, n_heads=2, n_layers=1, d_ff=256, src_vocab_size=500,
                               tgt_vocab_size=500, max_seq_len=16)  # weights far above 4 tokens' activations
    model = build(name, config, seed=0).train()
    gradients = 4 * sum(p.numel() for p in model.parameters())  # float32, by hand
    measured, _ = profile_step("cpu", forward_backward(model, random_batch(config, 1, 4, 4, seed=0)))
    predicted = predicted_peak(config, name, "train", 1, 4)
    assert predicted.gradients == gradients
    assert predicted.total == predicted.weights + gradients
    assert gradients <= measured <= gradients + predicted.activations


def test_the_prediction_grows_with_the_length_and_has_the_counted_quadratic_term():
    for name in VARIANTS:
        for phase in ("forward", "train"):
            totals = [predicted_peak(TINY, name, phase, 2, s).total for s in (32, 64, 128, 256)]
            assert totals == sorted(totals) and len(set(totals)) == 4, (name, phase)
    # by hand: 3 attentions per layer, 3 tensors each kept for the backward, B H S^2 floats each
    assert predicted_peak(TINY, "explicit", "train", 2, 64).scores == 3 * 3 * 1 * 2 * 2 * 64 * 64 * 4


def test_the_memory_wall_is_the_first_length_at_the_limit():
    assert memory_wall(lambda s: s * s, 1_000_000) == 1000  # by hand: 1000^2 = 10^6
    assert memory_wall(lambda s: s * s, 1_000_001) == 1001
    assert memory_wall(lambda s: 5, 10, ceiling=64) is None

    def predict(length: int) -> float:
        return predicted_peak(TINY, "explicit", "train", 2, length).total

    wall = memory_wall(predict, 24 * 2**30)
    assert predict(wall) >= 24 * 2**30 > predict(wall - 1)


@pytest.mark.parametrize(("argv", "says"), [
    (["--max-len", "16"], "--max-len must be at least 32"),
    (["--rounds", "0"], "--rounds"),
    (["--preset", "huge"], "--preset"),
    (["--decode-len", "8"], "--decode-len must be at least 16"),
    (["--plot", "picture.jpg"], "does not end in .png"),
])
def test_a_bad_option_is_one_line_and_exit_2(argv, says, capsys, monkeypatch):
    monkeypatch.setattr(scaling, "settle_threads", lambda *a: pytest.fail("measured first"))
    with pytest.raises(SystemExit) as stop:
        scaling.main(["--preset", "tiny", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_an_output_that_cannot_be_written_is_refused_before_any_timing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scaling, "settle_threads", lambda *a: pytest.fail("measured first"))
    monkeypatch.setattr(scaling, "build_rows", lambda *a: pytest.fail("built first"))
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for option in ("--json", "--markdown"):
        with pytest.raises(SystemExit) as stop:
            scaling.main(["--preset", "tiny", option, str(blocker / "out.json")])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert str(blocker) in err and err.count("\n") == 1


def test_a_run_reread_gives_its_own_tables_with_the_predictions_made_again(tmp_path, capsys):
    """--reread times nothing: a recorded run (made here by hand, its predictions spoilt) comes
    back with the fits and walls the run printed and the predictions the analysis makes now."""
    config = TransformerConfig(**{**scaling.PRESETS["tiny"].fields, "max_seq_len": 64})
    rows = ("explicit", "fused")
    settings = ScalingSettings(config, rows, (32, 64), 128, 2, (16,), 2, 16, 2, 0.002, 1, 0, math.inf)
    rng = np.random.default_rng(0)

    def size(sweep: str, length: int, batch: int) -> SizeResult:
        keys = [f"{row}/{phase}" for row in rows for phase in PHASES]
        keys += [f"core:{kind}/{phase}" for kind in ("materialised", "sdpa") for phase in PHASES]
        cells = {key: Cell(rounds=list(rng.uniform(1e-3, 2e-3, 2) * length)) for key in keys}
        return SizeResult(sweep, length, batch, cells, {key: 10**6 for key in keys if ":" not in key}, {})

    measured = [size("tokens", 32, 4), size("tokens", 64, 2), size("batch", 32, 2), size("batch", 64, 2)]
    decoding = {row: {"cached": {16: [1e-3, 1.1e-3]}, "recompute": {16: [2e-3, 2.2e-3]}} for row in rows}
    options = argparse.Namespace(fit_octaves=2, wall_gib=24.0)
    meta = {"preset": "tiny", "threads": 1, "rounds": 2, "seconds_per_block": 0.002, "fit_octaves": 2,
            "wall_gib": 24.0, "finished": True}
    report = {**scaling.summarise(settings, measured, decoding, options), "meta": meta}
    expected = scaling.markdown(report).split("\n\n", 1)[1]
    for recorded in report["sizes"]:
        for cell in recorded["cells"].values():
            if "predicted" in cell:
                cell["predicted"] = {"total": 1}  # as an older analysis might have predicted
    for fit in report["fits"]:
        fit["wall_length"] = 1
    path, out = tmp_path / "run.json", tmp_path / "again.md"
    path.write_text(json.dumps(report), encoding="utf-8")
    assert scaling.main(["--reread", str(path), "--markdown", str(out)]) == 0
    again = out.read_text(encoding="utf-8")
    assert again.split("\n\n", 1)[1] == expected + "\n"
    assert f"reread {path}" in again.splitlines()[0]
    assert "predicted MiB" in again and "| 0.0 " not in again


def test_reread_never_writes_over_the_run_it_reads_nor_tracebacks_on_a_wrong_field(tmp_path, capsys):
    run = tmp_path / "run.json"
    recorded = {"meta": {"preset": "tiny", "rounds": 1, "seconds_per_block": 0.01, "threads": 1,
                         "fit_octaves": 2, "wall_gib": 24.0},
                "sizes": [{"sweep": sweep, "length": 32, "batch": 2, "skipped": {},
                           "cells": {"explicit/forward": {"rounds_s": ["slow"], "error": None}}}
                          for sweep in ("tokens", "batch")],
                "decode": []}
    run.write_text(json.dumps(recorded), encoding="utf-8")
    before = run.read_bytes()
    for option in ("--json", "--markdown", "--plot"):
        with pytest.raises(SystemExit) as exited:
            scaling.main(["--reread", str(run), option, str(run)])
        assert exited.value.code == 2 and "is the input" in capsys.readouterr().err
    assert run.read_bytes() == before
    with pytest.raises(SystemExit) as exited:
        scaling.main(["--reread", str(run)])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1
    assert f"{run}: not a scaling study's --json" in err and "rounds_s" in err
