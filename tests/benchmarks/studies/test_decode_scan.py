"""benchmarks.studies.decode_scan: one interleaved run gives the cache's speed-up at every length, and each
row's cached step against the machine's limit (weight bytes / read bandwidth); the levers."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

import benchmarks.studies.decode_scan as decode_scan
from benchmarks.compare.workload import TIMING_PRESETS
from benchmarks.studies.bandwidth import Bandwidth, step_weight_bytes
from benchmarks.studies.decode_scan import DVGenerator, main
from common.config import TransformerConfig
from common.weights import import_weights
from tests.helpers import random_canonical, small_config
from variants import build

# a small bandwidth buffer, briefly: the tests check the wiring, not the machine
TINY = ["--preset", "tiny", "--batch", "2", "--src-len", "4", "--threads", "1",
        "--bandwidth-mib", "1", "--bandwidth-seconds", "0.01"]


def test_a_row_per_power_of_two_plus_one_and_the_last_length(capsys):
    assert main([*TINY, "--max-len", "6", "--target", "0.01"]) == 0
    out = capsys.readouterr().out
    lengths = [int(n) for n in re.findall(r"^\| (\d+) ", out, flags=re.M)]
    assert lengths == [2, 3, 5, 6]
    assert "speed-up first >= 0.01x at L = 2 ids" in out  # any run beats a hundredth at once


def test_an_unreachable_target_is_reported_as_such(capsys):
    assert main([*TINY, "--max-len", "3", "--target", "1e9"]) == 0
    assert "speed-up below 1e+09x up to L = 3 ids" in capsys.readouterr().out


def test_a_length_past_max_seq_len_is_refused_before_any_model_is_built(capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--max-len", "129"])  # the tiny preset's max_seq_len is 128
    assert stop.value.code == 2
    assert "--max-len must lie in [2, max_seq_len=128]" in capsys.readouterr().err


def test_ops_counts_the_kernel_running_operators_of_a_cached_step_per_variant(capsys):
    assert main([*TINY, "--ops"]) == 0
    counts = dict(re.findall(r"^\| (\w+) +\| +(\d+) \|$", capsys.readouterr().out, flags=re.M))
    assert set(counts) == {"explicit", "einsum", "mathfirst", "fused"}
    assert all(int(n) > 0 for n in counts.values())


def table(out: str) -> list[list[str]]:
    """The rows of the printed table, cells stripped, the header and rule left out."""
    lines = [line for line in out.splitlines() if re.match(r"^\| \d", line)]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_each_row_puts_its_cached_step_against_weight_bytes_over_bandwidth(monkeypatch, capsys):
    """A clock on which every cached step takes 10 ms and every uncached one 30 ms, and a
    bandwidth of 1 GB/s: "at limit" is (weight bytes / 1e9) / 10 ms in every row."""
    clock = iter(step * 0.010 for pair in range(100) for step in (4 * pair, 4 * pair + 1, 4 * pair + 1,
                                                                     4 * pair + 4))
    monkeypatch.setattr(decode_scan, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(decode_scan, "read_bandwidth",
                        lambda settings: Bandwidth(1e9, 2**20, settings.threads, measurement=None))
    assert main([*TINY, "--max-len", "5"]) == 0
    out = capsys.readouterr().out
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    weights = step_weight_bytes(config, torch.float32, batch=2).total
    assert f"limit: {weights / 1e6:.1f} MB of weights per step / 1.00 GB/s read" in out
    rows = table(out)
    assert [row[0] for row in rows] == ["2", "3", "5"]
    for _, cached_ms, at_limit, uncached_ms, step_ratio, *_, speed_up in rows:
        assert (cached_ms, uncached_ms, step_ratio, speed_up) == ("10", "30", "3.0x", "3.0x")
        assert at_limit == f"{weights / 1e9 / 0.010:.0%}"


def test_bfloat16_halves_the_weight_bytes_and_the_levers_are_named(capsys):
    assert main([*TINY, "--max-len", "3", "--variant", "fused", "--static", "--generator-layout", "dv",
                 "--decode-dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    config = TransformerConfig(**TIMING_PRESETS["tiny"].fields)
    halved = step_weight_bytes(config, torch.float32, batch=2).total / 2
    assert f"limit: {halved / 1e6:.1f} MB of weights per step" in out
    assert "fused, preset tiny, bfloat16" in out and "cached step: static, generator dv, eager" in out
    assert len(table(out)) == 2


def test_static_needs_the_fused_variant(capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--max-len", "3", "--static"])
    assert stop.value.code == 2
    assert "--static needs --variant fused" in capsys.readouterr().err


@pytest.mark.parametrize("missing", [["--static"], ["--compile-step"]])
def test_freezing_is_a_lever_of_the_compiled_static_step(missing, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--max-len", "3", "--variant", "fused", "--freezing", *missing])
    assert stop.value.code == 2
    assert "--freezing is a lever of the compiled static step" in capsys.readouterr().err


@pytest.mark.parametrize("others", [[], ["--static", "--decode-dtype", "bfloat16"],
                                    ["--static", "--generator-layout", "dv"], ["--static", "--compile-step"]])
def test_onednn_is_a_lever_of_the_float32_static_step(others, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--max-len", "3", "--variant", "fused", "--onednn", *others])
    assert stop.value.code == 2
    assert "--onednn is a lever of the float32 static step" in capsys.readouterr().err


def test_the_onednn_static_step_is_scanned_and_named(capsys):
    assert main([*TINY, "--max-len", "3", "--variant", "fused", "--static", "--onednn"]) == 0
    out = capsys.readouterr().out
    assert "cached step: static, generator linear, oneDNN linears, eager" in out
    assert len(table(out)) == 2


def test_compile_step_compiles_the_cached_step_and_warms_it_up_before_timing(monkeypatch, capsys):
    """torch.compile stood in for by a recorder: the cached path goes through what it returned,
    the warm-up steps first; the uncached path does not."""
    calls = []

    def fake_compile(function, **options):
        def compiled(*arguments):
            calls.append(arguments[-1].shape[1])  # the prefix length of each compiled step
            return function(*arguments)
        return compiled

    monkeypatch.setattr(decode_scan.torch, "compile", fake_compile)
    assert main([*TINY, "--max-len", "4", "--variant", "fused", "--compile-step"]) == 0
    warm_up = list(range(1, decode_scan.WARM_UP_STEPS))  # capped at max_len - 1 = 3 steps
    assert calls == [*warm_up, 1, 2, 3]
    assert "growing cache, generator linear, compiled" in capsys.readouterr().out


def test_the_dv_generator_gives_the_models_log_probs():
    """float64, random canonical weights (a nonzero bias): a (D, V) copy of the canonical
    generator weight, x @ W + b, equals project."""
    model = build("explicit", small_config())
    import_weights(model, random_canonical(small_config()))
    model.double()
    hidden = torch.randn(3, 2, small_config().d_model, dtype=torch.float64)
    wrapped = DVGenerator(model)
    assert wrapped.weight.shape == (small_config().d_model, small_config().tgt_vocab_size)
    assert wrapped.weight.is_contiguous() and wrapped.config is model.config
    torch.testing.assert_close(wrapped.project(hidden), model.project(hidden), atol=1e-10, rtol=0)
